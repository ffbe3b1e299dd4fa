//! The four bytes every distinct body starts with, in both forms (docs/FORMAT.md, section
//! "distinct"): precision, sparse precision, representation, a reserved zero; and the
//! sparse tokens' list that follows a sparse header in both.

use super::sparse::SPARSE_PRECISION;
use super::{MAX_PRECISION, MIN_PRECISION};
use crate::error::DecodeError;
use crate::format::BodyReader;

/// A decode error naming the field at fault.
pub(crate) fn invalid(field: &'static str, reason: String) -> DecodeError {
    DecodeError::Invalid { field, reason }
}

/// Appends the header: precision, sparse precision, `representation`, a reserved zero.
pub(crate) fn write_header(out: &mut Vec<u8>, precision: u8, representation: u8) {
    out.extend_from_slice(&[precision, SPARSE_PRECISION, representation, 0]);
}

/// Appends sparse tokens (HyperLogLog calls them entries): their count, then each, all
/// little-endian `u32`s. At most `3·2^18/4` tokens, so the count fits a `u32`.
pub(crate) fn write_tokens(out: &mut Vec<u8>, tokens: &[u32]) {
    out.reserve(4 + 4 * tokens.len());
    out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for token in tokens {
        out.extend_from_slice(&token.to_le_bytes());
    }
}

/// Reads the header, each field checked, and returns the precision and the
/// representation, which must be one of `representations`; `expected` names them in the
/// error otherwise.
pub(crate) fn read_header(
    reader: &mut BodyReader<'_>,
    representations: [u8; 2],
    expected: &str,
) -> Result<(u8, u8), DecodeError> {
    let precision = reader.u8("precision")?;
    if !(MIN_PRECISION..=MAX_PRECISION).contains(&precision) {
        return Err(invalid(
            "precision",
            format!("{precision} is outside {MIN_PRECISION}..={MAX_PRECISION}"),
        ));
    }
    let sparse_precision = reader.u8("sparse precision")?;
    if sparse_precision != SPARSE_PRECISION {
        return Err(invalid(
            "sparse precision",
            format!("{sparse_precision}, but format version 1 fixes it at {SPARSE_PRECISION}"),
        ));
    }
    let representation = reader.u8("representation")?;
    let reserved = reader.u8("reserved")?;
    if reserved != 0 {
        return Err(invalid("reserved", format!("{reserved}, must be 0")));
    }
    if representations.contains(&representation) {
        Ok((precision, representation))
    } else {
        Err(invalid(
            "representation",
            format!("{representation}, expected {expected}"),
        ))
    }
}
