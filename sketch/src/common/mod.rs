//! What the two distinct-count sketches, HyperLogLog ([`crate::hll`]) and UltraLogLog
//! ([`crate::ull`]), share, kept once: their precision range, the body header they both
//! write, the sparse tokens of the virtual sketch at precision 25, how a hash picks a
//! dense register, the cache of the last estimate, and the moves between their sparse and
//! dense states (merge, fold, the body's frame). What differs between them (what a
//! register holds, how it merges, how it is packed and estimated) stays in each sketch.

pub(crate) mod body;
pub(crate) mod cache;
pub(crate) mod registers;
pub(crate) mod sparse;
pub(crate) mod state;

use crate::error::ParameterError;

/// The smallest precision of either sketch: 16 registers.
pub(crate) const MIN_PRECISION: u8 = 4;
/// The largest precision of either sketch: 262,144 registers.
pub(crate) const MAX_PRECISION: u8 = 18;

/// Checks that `precision` is in [`MIN_PRECISION`]`..=`[`MAX_PRECISION`].
pub(crate) fn check_precision(precision: u8) -> Result<(), ParameterError> {
    if (MIN_PRECISION..=MAX_PRECISION).contains(&precision) {
        Ok(())
    } else {
        Err(ParameterError::new(
            "precision",
            precision,
            format!("must be between {MIN_PRECISION} and {MAX_PRECISION}"),
        ))
    }
}

/// Checks that a sketch of precision `from` can fold to `to`: a valid precision, and never
/// up, since a register cannot be split.
pub(crate) fn check_fold(from: u8, to: u8) -> Result<(), ParameterError> {
    check_precision(to)?;
    if to > from {
        return Err(ParameterError::new(
            "precision",
            to,
            format!(
                "a sketch of precision {from} only folds down, to between {MIN_PRECISION} and {from}"
            ),
        ));
    }
    Ok(())
}
