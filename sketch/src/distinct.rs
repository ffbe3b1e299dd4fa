//! The `distinct` kind: how many distinct items, in either of its two forms.
//!
//! A distinct sketch is a HyperLogLog ([`Hll`]) or an UltraLogLog ([`Ull`]). Both hash
//! items the same way and travel in the same frame (kind 1); the body's representation
//! byte (offset 2) tells them apart: 0 and 1 are HyperLogLog sparse and dense, 2 and 3
//! UltraLogLog sparse and dense (docs/FORMAT.md). [`Distinct`] is either one, with the API
//! every sketch has, and [`DistinctForm`] names the form to build.
//!
//! # Error
//!
//! Each form keeps its own error: `1.04/√m` for HyperLogLog, `0.761/√m` for UltraLogLog at
//! `m = 2^p` registers once dense (0.81% for HyperLogLog at its default precision 14,
//! 0.84% for UltraLogLog at its default 13), both exact for small counts.
//! [`Distinct::estimate`] reports the error of the form it holds.
//!
//! # Merge
//!
//! Merging is the union of the item sets at the smaller of the two precisions, and never
//! fails:
//!
//! * UltraLogLog ∪ UltraLogLog stays an UltraLogLog;
//! * if either side is a HyperLogLog, the result is the HyperLogLog of the union: the
//!   UltraLogLog side is converted with [`Ull::to_hll`], which is exact. The answer then
//!   carries the weaker sketch's error bar, never a smaller one than its inputs justify.
//!
//! The result is a function of the set of hashes, the smallest precision and whether any
//! input was a HyperLogLog, so it does not depend on the order of merges: merge is
//! commutative, associative and idempotent, and equals, byte for byte, the sketch of the
//! union built directly in that form and precision. This is what lets a metric switch
//! form: a range holding stored HyperLogLog rows and newer UltraLogLog rows answers as the
//! HyperLogLog of all of them.
//!
//! # Example
//!
//! ```
//! use hourglass_sketch::distinct::{Distinct, DistinctForm};
//!
//! let mut old = Distinct::new(DistinctForm::Hll, 14)?;
//! let mut new = Distinct::new("ull".parse()?, 14)?;
//! for user in 0..1000u32 {
//!     old.insert(&user.to_le_bytes());
//! }
//! for user in 500..1500u32 {
//!     new.insert(&user.to_le_bytes());
//! }
//! // Both forms decode from the same frame kind.
//! let shipped = Distinct::decode(&new.encode())?;
//! assert_eq!(shipped.form(), DistinctForm::Ull);
//!
//! // A HyperLogLog on either side makes the union a HyperLogLog.
//! old.merge(&shipped)?;
//! assert_eq!(old.form(), DistinctForm::Hll);
//! assert_eq!(old.estimate().estimate.round(), 1500.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::error::{DecodeError, MergeError, ParameterError};
use crate::estimate::Estimate;
use crate::format::{Kind, decode_frame, encode_frame};
use crate::hll::Hll;
use crate::ull::Ull;

/// Which sketch a distinct series keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DistinctForm {
    /// HyperLogLog: six-bit registers, relative standard error `1.04/√m`.
    Hll,
    /// UltraLogLog: byte registers, relative standard error `0.761/√m`, about 28% fewer
    /// bytes than HyperLogLog at the same error.
    Ull,
}

impl DistinctForm {
    /// Both forms.
    pub const ALL: [DistinctForm; 2] = [DistinctForm::Hll, DistinctForm::Ull];

    /// The form's name as users write it: `hll` or `ull`.
    pub fn name(self) -> &'static str {
        match self {
            DistinctForm::Hll => "hll",
            DistinctForm::Ull => "ull",
        }
    }

    /// The precision a sketch of this form gets when none is set: HyperLogLog 14 (0.81%
    /// in 12 KiB dense), UltraLogLog 13 (0.84% in 8 KiB dense), so that either default
    /// gives about the same error and UltraLogLog's takes a third fewer bytes.
    pub fn default_precision(self) -> u8 {
        match self {
            DistinctForm::Hll => crate::hll::DEFAULT_PRECISION,
            DistinctForm::Ull => crate::ull::DEFAULT_PRECISION,
        }
    }

    /// The sketch's name for people: `HyperLogLog` or `UltraLogLog`.
    pub fn long_name(self) -> &'static str {
        match self {
            DistinctForm::Hll => "HyperLogLog",
            DistinctForm::Ull => "UltraLogLog",
        }
    }
}

impl std::fmt::Display for DistinctForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DistinctForm {
    type Err = ParameterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DistinctForm::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                ParameterError::new(
                    "distinct form",
                    format!("{s:?}"),
                    "expected \"hll\" (HyperLogLog) or \"ull\" (UltraLogLog)",
                )
            })
    }
}

/// A distinct sketch in either form: see the [module documentation](self) for the merge
/// rule. Equality compares the form and the canonical state, what [`Distinct::encode`]
/// writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Distinct {
    /// HyperLogLog.
    Hll(Hll),
    /// UltraLogLog.
    Ull(Ull),
}

impl From<Hll> for Distinct {
    fn from(sketch: Hll) -> Distinct {
        Distinct::Hll(sketch)
    }
}

impl From<Ull> for Distinct {
    fn from(sketch: Ull) -> Distinct {
        Distinct::Ull(sketch)
    }
}

/// Representation bytes (body offset 2) of each form.
const HLL_REPRESENTATIONS: [u8; 2] = [0, 1];
const ULL_REPRESENTATIONS: [u8; 2] = [2, 3];

impl Distinct {
    /// An empty sketch of `form` with `2^precision` registers; `precision` must be in
    /// 4..=18 ([`crate::hll::MIN_PRECISION`], [`crate::hll::MAX_PRECISION`]).
    pub fn new(form: DistinctForm, precision: u8) -> Result<Distinct, ParameterError> {
        Ok(match form {
            DistinctForm::Hll => Distinct::Hll(Hll::new(precision)?),
            DistinctForm::Ull => Distinct::Ull(Ull::new(precision)?),
        })
    }

    /// Which form the sketch is.
    pub fn form(&self) -> DistinctForm {
        match self {
            Distinct::Hll(_) => DistinctForm::Hll,
            Distinct::Ull(_) => DistinctForm::Ull,
        }
    }

    /// The precision `p`: the sketch has `2^p` registers once dense.
    pub fn precision(&self) -> u8 {
        match self {
            Distinct::Hll(s) => s.precision(),
            Distinct::Ull(s) => s.precision(),
        }
    }

    /// Whether the sketch is still in its sparse state.
    pub fn is_sparse(&self) -> bool {
        match self {
            Distinct::Hll(s) => s.is_sparse(),
            Distinct::Ull(s) => s.is_sparse(),
        }
    }

    /// Adds an item, hashed with [`crate::hash::item_hash`].
    #[inline]
    pub fn insert(&mut self, item: &[u8]) {
        self.insert_hash(crate::hash::item_hash(item));
    }

    /// Adds every item of `items`: the same sketch as adding them one by one, faster for
    /// a run of many ([`Ull::insert_all`]).
    pub fn insert_all<'a>(&mut self, items: impl ExactSizeIterator<Item = &'a [u8]>) {
        match self {
            Distinct::Hll(s) => items.for_each(|item| s.insert(item)),
            Distinct::Ull(s) => s.insert_all(items),
        }
    }

    /// Adds an item by its hash, for callers that already computed
    /// [`crate::hash::item_hash`].
    #[inline]
    pub fn insert_hash(&mut self, hash: u64) {
        match self {
            Distinct::Hll(s) => s.insert_hash(hash),
            Distinct::Ull(s) => s.insert_hash(hash),
        }
    }

    /// Adds every item of `other`, at the smaller of the two precisions. An UltraLogLog
    /// stays one only if `other` is one too; otherwise the result is the HyperLogLog of
    /// the union (module docs). Never fails; the `Result` keeps the signature of every
    /// other sketch's merge.
    pub fn merge(&mut self, other: &Distinct) -> Result<(), MergeError> {
        match (&mut *self, other) {
            (Distinct::Hll(a), Distinct::Hll(b)) => a.merge(b),
            (Distinct::Ull(a), Distinct::Ull(b)) => a.merge(b),
            (Distinct::Hll(a), Distinct::Ull(b)) => a.merge(&b.to_hll()),
            (Distinct::Ull(a), Distinct::Hll(b)) => {
                let mut hll = a.to_hll();
                hll.merge(b)?;
                *self = Distinct::Hll(hll);
                Ok(())
            }
        }
    }

    /// The sketch of the same items and form at a lower (or equal) precision, exactly.
    pub fn fold_to(&self, precision: u8) -> Result<Distinct, ParameterError> {
        Ok(match self {
            Distinct::Hll(s) => Distinct::Hll(s.fold_to(precision)?),
            Distinct::Ull(s) => Distinct::Ull(s.fold_to(precision)?),
        })
    }

    /// The estimated number of distinct items, with the standard error of the form held
    /// and its 95% interval.
    pub fn estimate(&self) -> Estimate {
        match self {
            Distinct::Hll(s) => s.estimate(),
            Distinct::Ull(s) => s.estimate(),
        }
    }

    /// The HyperLogLog of the same items at the same precision, exactly: for the
    /// estimators only HyperLogLog has (the overlap of two sets, [`crate::overlap`]).
    pub fn to_hll(&self) -> Hll {
        match self {
            Distinct::Hll(s) => s.clone(),
            Distinct::Ull(s) => s.to_hll(),
        }
    }

    /// [`Distinct::to_hll`], without a copy when the sketch is a HyperLogLog already.
    pub fn into_hll(self) -> Hll {
        match self {
            Distinct::Hll(s) => s,
            Distinct::Ull(s) => s.to_hll(),
        }
    }

    /// Bytes of sketch state held in memory, for memory accounting.
    pub fn size_bytes(&self) -> usize {
        match self {
            Distinct::Hll(s) => s.size_bytes(),
            Distinct::Ull(s) => s.size_bytes(),
        }
    }

    /// The sketch in the framed binary format of docs/FORMAT.md (kind distinct).
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        self.encode_body(&mut body);
        encode_frame(Kind::Distinct, &body)
    }

    /// Reads a distinct frame of either form; any other input is an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Distinct, DecodeError> {
        let (kind, body) = decode_frame(bytes)?;
        if kind != Kind::Distinct {
            return Err(DecodeError::WrongKind {
                expected: Kind::Distinct,
                found: kind,
            });
        }
        Distinct::decode_body(body)
    }

    /// Appends the body (without the frame) to `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            Distinct::Hll(s) => s.encode_body(out),
            Distinct::Ull(s) => s.encode_body(out),
        }
    }

    /// Reads a body (without the frame) of any of the four representations, validating
    /// every field.
    pub fn decode_body(body: &[u8]) -> Result<Distinct, DecodeError> {
        match body.get(2) {
            Some(r) if ULL_REPRESENTATIONS.contains(r) => {
                Ok(Distinct::Ull(Ull::decode_body(body)?))
            }
            Some(&r) if !HLL_REPRESENTATIONS.contains(&r) => Err(unknown_representation(body, r)),
            _ => Ok(Distinct::Hll(Hll::decode_body(body)?)),
        }
    }

    /// Checks a body exactly as [`Distinct::decode_body`] does, building no sketch where
    /// the format allows.
    pub fn validate_body(body: &[u8]) -> Result<(), DecodeError> {
        match body.get(2) {
            Some(r) if ULL_REPRESENTATIONS.contains(r) => Ull::validate_body(body),
            Some(&r) if !HLL_REPRESENTATIONS.contains(&r) => Err(unknown_representation(body, r)),
            _ => Hll::validate_body(body),
        }
    }
}

/// The error for a body whose representation byte names neither form. The header fields
/// before it are checked first, by HyperLogLog's reader, so the error names the first
/// field at fault whichever it is.
fn unknown_representation(body: &[u8], representation: u8) -> DecodeError {
    match Hll::validate_body(body) {
        Err(DecodeError::Invalid {
            field: "representation",
            ..
        })
        | Ok(()) => DecodeError::Invalid {
            field: "representation",
            reason: format!(
                "{representation}, expected 0 or 1 (HyperLogLog sparse, dense) or 2 or 3 \
                 (UltraLogLog sparse, dense)"
            ),
        },
        Err(other) => other,
    }
}

#[cfg(test)]
mod tests;
