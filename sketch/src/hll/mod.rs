//! HyperLogLog: how many distinct items?
//!
//! # Structure
//!
//! Every item is hashed to 64 bits with [`crate::hash::item_hash`]. A sketch of precision
//! `p` (4 to 18, default 14) is in one of two states, and which one is a function of the
//! set of inserted hashes alone, never of insertion order or of how the sketch was merged:
//!
//! * **Sparse**, while the sketch is small. Each hash becomes an entry of a virtual
//!   HyperLogLog at the much higher [`SPARSE_PRECISION`] 25: the register index is the
//!   top 25 bits and the rank is one more than the leading zeros of the other 39 bits
//!   (capped at 40). The sketch keeps one `u32` entry `index << 6 | rank` per distinct
//!   index, with the largest rank seen, sorted by index.
//! * **Dense**, once the number of sparse entries exceeds `3·2^p/16`, the point at which
//!   four bytes per entry would outweigh the `0.75·2^p` bytes of the dense encoding. The
//!   sketch then holds `m = 2^p` registers: register `h >> (64 − p)` keeps the maximum of
//!   `min(leading_zeros(h << p), 64 − p) + 1`, a value in `1..=65 − p`. In memory each
//!   register is a byte; the encoding packs them into six bits.
//!
//! A sparse entry determines the dense register its hash would set at any precision up to
//! 25, so converting sparse to dense, and folding a dense sketch to a lower precision, give
//! exactly the registers that inserting the same hashes directly would give.
//!
//! # Error
//!
//! [`Hll::estimate`] uses Otmar Ertl's improved raw estimator (2017), which needs no bias
//! tables and is unbiased across the whole range. A dense sketch has a relative standard
//! error of about `1.04/√m`: 0.81% at the default precision 14, 3.25% at 10. While sparse
//! the sketch behaves like one of 2^25 registers, so below a few dozen items the estimate
//! is the exact count and above that its error is far below the dense figure (measured in
//! docs/ACCURACY.md). The interval never reaches below the number of sparse entries, since
//! each stands for at least one distinct item.
//!
//! # Merge
//!
//! Merging is the union of the two item sets: sparse entries unite keeping the larger rank
//! per index, dense registers take the maximum. Sketches of different precisions merge to
//! the smaller one, folding the other down exactly, so a merge never fails. Because the
//! state depends only on the set of hashes, `merge(sketch(A), sketch(B))` encodes byte for
//! byte like `sketch(A ∪ B)`, and merge is commutative and associative.
//!
//! # Encoding
//!
//! The body inside the common frame ([`crate::format`]) is specified byte by byte in
//! docs/FORMAT.md (section "distinct"): precision, sparse precision, representation, a
//! reserved byte, then either the sorted sparse entries or the packed registers. The
//! decoder validates every field and names the one at fault.
//!
//! # Example
//!
//! ```
//! use hourglass_sketch::hll::Hll;
//!
//! let mut monday = Hll::new(14)?;
//! for user in 0..1000u32 {
//!     monday.insert(&user.to_le_bytes());
//! }
//! let mut tuesday = Hll::default();
//! for user in 500..1500u32 {
//!     tuesday.insert(&user.to_le_bytes());
//! }
//! monday.merge(&tuesday)?;
//!
//! let both = monday.estimate();
//! assert_eq!(both.estimate.round(), 1500.0);
//! assert!(both.lower95 <= 1500.0 && 1500.0 <= both.upper95);
//!
//! let bytes = monday.encode();
//! assert_eq!(Hll::decode(&bytes)?, monday);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod dense;
mod estimate;
mod sparse;

use crate::common::body::invalid;
use crate::common::cache::EstimateCache;
use crate::common::state::{Repr, SparseOrDense, SparseSet, shared_methods, state_fields};
use crate::common::{self, check_precision};
use crate::error::DecodeError;
use crate::estimate::Estimate;
use crate::format::{BodyReader, Kind, decode_frame, encode_frame};
use sparse::SparseList;

/// The smallest precision: 16 registers.
pub const MIN_PRECISION: u8 = common::MIN_PRECISION;
/// The largest precision: 262,144 registers, 192 KiB encoded.
pub const MAX_PRECISION: u8 = common::MAX_PRECISION;
/// The precision of [`Hll::default`]: 16,384 registers, 0.81% standard error, 12 KiB
/// encoded.
pub const DEFAULT_PRECISION: u8 = 14;
/// The precision of the virtual sketch behind sparse entries; part of the format.
pub const SPARSE_PRECISION: u8 = common::sparse::SPARSE_PRECISION;

/// Representation byte of a sparse body.
const REPRESENTATION_SPARSE: u8 = 0;
/// Representation byte of a dense body.
const REPRESENTATION_DENSE: u8 = 1;

/// A HyperLogLog sketch: an estimate of the number of distinct items inserted.
///
/// See the [module documentation](self) for the structure, the error and the merge rule.
/// Equality compares the canonical state, which is what [`Hll::encode`] writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hll {
    precision: u8,
    repr: Repr<SparseList>,
    /// The last point estimate, until the registers change: a query asks a merged sketch
    /// for its estimate once or more, and the register pass is the estimate's whole cost.
    cached: EstimateCache,
}

/// `1/√m` for a power of two `m`, without a square root (a cached estimate is otherwise
/// a load and a few multiplies): `2^(−k/2)`, times `1/√2` when `k` is odd.
fn inverse_sqrt_power_of_two(m: u64) -> f64 {
    let k = m.trailing_zeros();
    let half = 1.0 / (1u64 << (k / 2)) as f64;
    if k % 2 == 1 {
        half * std::f64::consts::FRAC_1_SQRT_2
    } else {
        half
    }
}

/// The most sparse entries a sketch of `precision` holds before it turns dense.
fn sparse_limit(precision: u8) -> usize {
    3 * (1usize << precision) / 16
}

impl Hll {
    shared_methods!("entries");

    /// Adds an item by its hash, for callers that already computed
    /// [`crate::hash::item_hash`]. Any other 64-bit hash works as well, but sketches only
    /// merge meaningfully if they agree on the hash function.
    #[inline]
    pub fn insert_hash(&mut self, hash: u64) {
        match &mut self.repr {
            Repr::Dense(registers) => {
                let (index, rank) = dense::position(hash, self.precision);
                if let Some(register) = registers.get_mut(index) {
                    // Most inserts into a warm sketch change nothing: skipping the store
                    // keeps the cache line clean and the estimate cached.
                    if rank > *register {
                        *register = rank;
                        self.cached.clear();
                    }
                }
            }
            Repr::Sparse(entries) => {
                self.cached.clear();
                entries.insert(sparse::entry_of_hash(hash));
                if entries.len() > sparse_limit(self.precision) {
                    self.repr = Repr::Dense(self.registers_at(self.precision));
                }
            }
        }
    }

    /// The estimated number of distinct items, with its standard error and 95% interval.
    pub fn estimate(&self) -> Estimate {
        // 1.04/√m is the asymptotic error of HyperLogLog with m registers. It overstates
        // the error in both regimes where we use it: a sparse sketch holds at most
        // 3·2^18/16 items in 2^25 registers, where the estimate is close to linear
        // counting with relative error about 1/√(2m); a dense sketch below a few m items
        // is in the same linear-counting range, where the error is also smaller.
        self.estimate_with(
            &self.cached,
            || self.raw_estimate(),
            |estimate, registers| estimate * 1.04 * inverse_sqrt_power_of_two(registers),
        )
    }

    /// Ertl's estimate from the registers, without the cache.
    fn raw_estimate(&self) -> f64 {
        let (estimate, _, _) = match &self.repr {
            Repr::Sparse(entries) => {
                let mut histogram = [0u32; 64];
                for entry in entries.iter() {
                    histogram[(sparse::rank_of(entry) & 63) as usize] += 1;
                }
                // At most 3·2^18/16 entries, so the count fits and is below 2^25.
                histogram[0] = (sparse::SPARSE_REGISTERS as usize - entries.len()) as u32;
                let estimate = estimate::ertl(
                    &histogram,
                    sparse::MAX_SPARSE_RANK - 1,
                    sparse::SPARSE_REGISTERS,
                );
                (estimate, sparse::SPARSE_REGISTERS, entries.len() as f64)
            }
            Repr::Dense(registers) => {
                let m = 1u64 << self.precision;
                let q = 64 - u32::from(self.precision);
                (estimate::ertl(&dense::histogram(registers), q, m), m, 0.0)
            }
        };
        estimate
    }

    /// The sketch in the framed binary format of docs/FORMAT.md.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        self.encode_body(&mut body);
        encode_frame(Kind::Distinct, &body)
    }

    /// Reads a sketch written by [`Hll::encode`]; any other input is an error, never a
    /// panic. Strict: an UltraLogLog in a distinct frame (representation 2 or 3) is an
    /// invalid `representation` here; [`crate::distinct::Distinct::decode`] reads both.
    pub fn decode(bytes: &[u8]) -> Result<Hll, DecodeError> {
        let (kind, body) = decode_frame(bytes)?;
        if kind != Kind::Distinct {
            return Err(DecodeError::WrongKind {
                expected: Kind::Distinct,
                found: kind,
            });
        }
        Hll::decode_body(body)
    }

    /// Appends the body (without the frame) to `out`.
    pub(crate) fn encode_body(&self, out: &mut Vec<u8>) {
        self.write_body(out);
    }

    /// Reads a body (without the frame), validating every field.
    pub(crate) fn decode_body(body: &[u8]) -> Result<Hll, DecodeError> {
        Hll::read_body(body)
    }

    /// Checks a body exactly as [`Hll::decode_body`] does, without building the sketch:
    /// dense registers are checked in their packed form, with no copy.
    pub(crate) fn validate_body(body: &[u8]) -> Result<(), DecodeError> {
        let mut reader = BodyReader::new(body);
        let (precision, representation) = Hll::read_header(&mut reader)?;
        match representation {
            REPRESENTATION_SPARSE => {
                Hll::decode_sparse(&mut reader, precision)?;
            }
            _ => {
                let bytes = reader.take((1usize << precision) / 4 * 3, "dense registers")?;
                if dense::exceeds(bytes, 65 - precision) {
                    // The rare failure path decodes, to name the offending register.
                    Hll::decode_dense(&mut BodyReader::new(bytes), precision)?;
                }
            }
        }
        reader.finish()
    }
}

/// A HyperLogLog register keeps the largest rank: sketches unite by the maximum, and the
/// dense body packs each register into six bits.
impl SparseOrDense for Hll {
    type Sparse = SparseList;
    const SPARSE: u8 = REPRESENTATION_SPARSE;
    const DENSE: u8 = REPRESENTATION_DENSE;
    const EXPECTED: &'static str = "0 (sparse) or 1 (dense)";

    fn sparse_limit(precision: u8) -> usize {
        sparse_limit(precision)
    }

    state_fields!(SparseList);

    fn write_dense(registers: &[u8], out: &mut Vec<u8>) {
        dense::pack(registers, out);
    }

    /// Reads the entries of a sparse body, each checked.
    fn decode_sparse(
        reader: &mut BodyReader<'_>,
        precision: u8,
    ) -> Result<SparseList, DecodeError> {
        let count = reader.u32("sparse entry count")? as usize;
        let limit = sparse_limit(precision);
        if count > limit {
            return Err(invalid(
                "sparse entry count",
                format!(
                    "{count} entries, but a sketch of precision {precision} turns dense above {limit}"
                ),
            ));
        }
        let bytes = reader.take(4 * count, "sparse entries")?;
        let mut entries = Vec::with_capacity(count);
        let mut previous_index = None;
        for (i, chunk) in bytes.chunks_exact(4).enumerate() {
            let entry = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let (index, rank) = (sparse::index_of(entry), sparse::rank_of(entry));
            if u64::from(index) >= sparse::SPARSE_REGISTERS {
                return Err(invalid(
                    "sparse entry",
                    format!("entry {i} has index {index}, above 2^{SPARSE_PRECISION} - 1"),
                ));
            }
            if !(1..=sparse::MAX_SPARSE_RANK).contains(&rank) {
                return Err(invalid(
                    "sparse entry",
                    format!(
                        "entry {i} has rank {rank}, outside 1..={}",
                        sparse::MAX_SPARSE_RANK
                    ),
                ));
            }
            if let Some(previous) = previous_index
                && index <= previous
            {
                return Err(invalid(
                    "sparse entry",
                    format!(
                        "entry {i} has index {index} after {previous}: indices must strictly increase"
                    ),
                ));
            }
            previous_index = Some(index);
            entries.push(entry);
        }
        Ok(SparseList::from_sorted(entries))
    }

    /// Reads the packed registers of a dense body, each checked.
    fn decode_dense(reader: &mut BodyReader<'_>, precision: u8) -> Result<Box<[u8]>, DecodeError> {
        let mut registers = dense::empty(precision);
        let bytes = reader.take(registers.len() / 4 * 3, "dense registers")?;
        let max_rank = 65 - precision;
        // Unpacking reports whether any register is out of range; only then is the first
        // offender looked for, to name it.
        if dense::unpack(bytes, &mut registers, max_rank)
            && let Some((i, &value)) = registers.iter().enumerate().find(|(_, r)| **r > max_rank)
        {
            return Err(invalid(
                "register",
                format!(
                    "register {i} holds {value}, above {max_rank}, the largest rank at precision {precision}"
                ),
            ));
        }
        Ok(registers)
    }

    /// Takes the maximum of `registers` (at `precision`, not above this sketch's) and this
    /// sketch's registers at that precision.
    fn unite_into(&self, registers: &mut [u8], precision: u8) {
        match &self.repr {
            Repr::Sparse(entries) => {
                for entry in entries.iter() {
                    let (index, rank) = sparse::dense_position(entry, precision);
                    if let Some(register) = registers.get_mut(index) {
                        *register = (*register).max(rank);
                    }
                }
            }
            Repr::Dense(mine) => dense::fold_into(registers, mine),
        }
    }
}

impl Default for Hll {
    /// An empty sketch of [`DEFAULT_PRECISION`].
    fn default() -> Hll {
        Hll::empty(DEFAULT_PRECISION)
    }
}

#[cfg(test)]
mod tests;

/// Register access for the joint overlap estimator ([`crate::overlap`]), which needs the
/// register values themselves, not just the estimate.
impl Hll {
    /// The registers at this sketch's precision, one byte each; a sparse sketch is
    /// converted exactly, as [`Hll::merge`] would.
    pub(crate) fn dense_registers(&self) -> Vec<u8> {
        match &self.repr {
            Repr::Dense(registers) => registers.to_vec(),
            Repr::Sparse(_) => self.registers_at(self.precision).into_vec(),
        }
    }

    /// While sparse, the occupied registers of the virtual sketch at
    /// [`SPARSE_PRECISION`] as `(index, value)`, sorted by index; `None` once dense.
    pub(crate) fn sparse_registers(&self) -> Option<Vec<(u32, u8)>> {
        match &self.repr {
            Repr::Sparse(entries) => Some(
                entries
                    .canonical()
                    .iter()
                    .map(|&entry| (sparse::index_of(entry), sparse::rank_of(entry) as u8))
                    .collect(),
            ),
            Repr::Dense(_) => None,
        }
    }
}

impl Hll {
    /// A dense sketch of `precision` from its registers, one byte each, every one at most
    /// `65 − precision`: how an UltraLogLog hands over the HyperLogLog of its items
    /// ([`crate::ull::Ull::to_hll`]). The caller guarantees a valid precision and values.
    pub(crate) fn from_dense_registers(precision: u8, registers: Box<[u8]>) -> Hll {
        debug_assert!(check_precision(precision).is_ok());
        debug_assert_eq!(registers.len(), 1 << precision);
        debug_assert!(registers.iter().all(|&r| r <= 65 - precision));
        Hll::from_parts(precision, Repr::Dense(registers))
    }
}
