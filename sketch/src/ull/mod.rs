//! UltraLogLog: how many distinct items, in about 28% fewer bytes than HyperLogLog at the
//! same error.
//!
//! UltraLogLog (Otmar Ertl, "UltraLogLog: A Practical and More Space-Efficient Alternative
//! to HyperLogLog for Approximate Distinct Counting", VLDB 2024) keeps, in each register,
//! the HyperLogLog rank and two bits of history: whether the two ranks just below it were
//! seen too. Those two bits carry more information than they cost, and with the
//! maximum-likelihood estimator a byte-per-register sketch of `m` registers has a relative
//! standard error of `0.761/√m`, where HyperLogLog's six-bit registers give `1.04/√m`.
//!
//! # Structure
//!
//! Every item is hashed to 64 bits with [`crate::hash::item_hash`], the hash
//! [`crate::hll::Hll`] uses. A sketch of precision `p` (4 to 18, default 13) is in one of
//! two states, a function of the set of inserted hashes alone:
//!
//! * **Sparse**, while at most `m/4` distinct indices of the virtual sketch at
//!   [`SPARSE_PRECISION`] 25 are occupied: the sketch keeps the hashes as sorted `u32`
//!   tokens `index << 6 | rank` at precision 25 (HyperLogLog's sparse entries), every
//!   distinct token except those three or more ranks below the largest of their index,
//!   which no register can remember. While items are inserted, the same set is held as one
//!   register per occupied index at precision 25 in a hash table, and spelled out as the
//!   sorted tokens when encoded or merged (module `sparse`).
//! * **Dense** above that, where the `m` bytes of registers are smaller than the tokens:
//!   register `h >> (64 − p)` holds `4·u + 2·[u − 1 seen] + [u − 2 seen]`, `u` the largest
//!   update value `min(leading_zeros(h << p), 64 − p) + 1` (HyperLogLog's rank) of its
//!   hashes.
//!
//! The HyperLogLog of the same items is sparse at most up to `3·m/16` indices, so whenever
//! this sketch is dense, so is it, and [`Ull::to_hll`] is exact: its registers are `r >> 2`,
//! its sparse entries the largest token of each index. Converting sparse to dense and
//! folding to a lower precision are exact too.
//!
//! # Error
//!
//! [`Ull::estimate`] is the maximum-likelihood estimate (module `estimate`), with a
//! relative standard error of about `0.761/√m` for a dense sketch: 0.84% at the default
//! precision 13 (8 KiB), 0.59% at 14 (16 KiB), 2.38% at 10. While sparse it behaves like a sketch of 2^25
//! registers: below a few dozen items the estimate is the exact count. The interval never
//! reaches below the number of occupied sparse indices, each at least one distinct item.
//!
//! # Merge
//!
//! Merging is the union of the item sets: tokens unite, registers take the union of their
//! remembered update values. Sketches of different precisions merge to the smaller one,
//! folding the other down exactly, so a merge never fails. `merge(sketch(A), sketch(B))`
//! encodes byte for byte like `sketch(A ∪ B)`.
//!
//! # Encoding
//!
//! [`Ull::encode_body`] writes precision, sparse precision, representation (2 sparse, 3
//! dense: the HyperLogLog body's representations are 0 and 1, so both share the distinct
//! frame kind), a reserved byte, then the tokens or the `m` register bytes.
//! [`Ull::decode_body`] validates every field and names the one at fault. Framed, an
//! UltraLogLog travels as a [`crate::distinct::Distinct`], whose decoder reads either form.
//!
//! # Example
//!
//! ```
//! use hourglass_sketch::ull::Ull;
//!
//! let mut monday = Ull::new(14)?;
//! for user in 0..1000u32 {
//!     monday.insert(&user.to_le_bytes());
//! }
//! let mut tuesday = Ull::default();
//! for user in 500..1500u32 {
//!     tuesday.insert(&user.to_le_bytes());
//! }
//! monday.merge(&tuesday)?;
//!
//! let both = monday.estimate();
//! assert_eq!(both.estimate.round(), 1500.0);
//! assert!(both.lower95 <= 1500.0 && 1500.0 <= both.upper95);
//!
//! let mut body = Vec::new();
//! monday.encode_body(&mut body);
//! assert_eq!(Ull::decode_body(&body)?, monday);
//! // The HyperLogLog of the same items, exactly.
//! assert_eq!(monday.to_hll().estimate().estimate.round(), 1500.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod estimate;
mod registers;
mod sparse;

use crate::common;
use crate::common::body::invalid;
use crate::common::cache::EstimateCache;
use crate::common::state::{Repr, SparseOrDense, shared_methods, state_fields};
use crate::error::DecodeError;
use crate::estimate::Estimate;
use crate::format::BodyReader;
use crate::hll::Hll;
use sparse::SparseTokens;

pub use estimate::MEMORY_VARIANCE_PRODUCT;

/// The smallest precision: 16 registers.
pub const MIN_PRECISION: u8 = common::MIN_PRECISION;
/// The largest precision: 262,144 registers, 256 KiB.
pub const MAX_PRECISION: u8 = common::MAX_PRECISION;
/// The precision of [`Ull::default`]: 8,192 registers, 0.84% standard error in 8 KiB
/// dense, about HyperLogLog's default error (0.81% at its precision 14) in two thirds of
/// its 12 KiB.
pub const DEFAULT_PRECISION: u8 = 13;
/// The precision of the virtual sketch behind sparse tokens; part of the format.
pub const SPARSE_PRECISION: u8 = common::sparse::SPARSE_PRECISION;

/// Representation byte of a sparse body (HyperLogLog's are 0 and 1).
const REPRESENTATION_SPARSE: u8 = 2;
/// Representation byte of a dense body.
const REPRESENTATION_DENSE: u8 = 3;

/// An UltraLogLog sketch: an estimate of the number of distinct items inserted.
///
/// See the [module documentation](self) for the structure, the error and the merge rule.
/// Equality compares the canonical state, which is what [`Ull::encode_body`] writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ull {
    precision: u8,
    repr: Repr<SparseTokens>,
    /// The last point estimate, until the state changes.
    cached: EstimateCache,
}

/// The most occupied sparse indices a sketch of `precision` holds before it turns dense:
/// `m/4`, where four bytes per token reach the `m` bytes of the registers.
fn sparse_limit(precision: u8) -> usize {
    (1usize << precision) / 4
}

impl Ull {
    shared_methods!("tokens");

    /// Whether `body` (as [`Ull::encode_body`] writes it) holds dense registers, one byte
    /// each, by its representation byte alone: for a store choosing how to compress it.
    pub fn is_dense_body(body: &[u8]) -> bool {
        body.get(2) == Some(&REPRESENTATION_DENSE)
    }

    /// Adds every item of `items`: the same sketch as adding them one by one with
    /// [`Ull::insert`], faster for a run of many. A sparse sketch first makes room for the
    /// run in its table, up to where it would turn dense, instead of growing it item by
    /// item (which, placing every entry again at each step, cost more than the inserts),
    /// and gives back what repeated items left unused.
    pub fn insert_all<'a>(&mut self, items: impl ExactSizeIterator<Item = &'a [u8]>) {
        if items.len() == 0 {
            // Nothing to make room for: a decoded sketch keeps its sorted list.
            return;
        }
        if let Repr::Sparse(tokens) = &mut self.repr {
            // Room for the limit at most, half full: the insert that crosses it (a table
            // grows only when three quarters full) turns the sketch dense without growing
            // the table first.
            tokens.reserve(items.len(), sparse_limit(self.precision));
        }
        for item in items {
            self.insert(item);
        }
        if let Repr::Sparse(tokens) = &mut self.repr {
            tokens.trim();
        }
    }

    /// Adds an item by its hash, for callers that already computed
    /// [`crate::hash::item_hash`].
    #[inline]
    pub fn insert_hash(&mut self, hash: u64) {
        match &mut self.repr {
            Repr::Dense(registers) => {
                let (index, value) = registers::position(hash, self.precision);
                if let Some(register) = registers.get_mut(index) {
                    // The update is one table lookup, without branches; most inserts into
                    // a warm sketch change nothing, so the one branch, around the store, is
                    // predictable, and skipping the store keeps the cache line clean and
                    // the estimate cached.
                    let updated = registers::update(*register, value);
                    if updated != *register {
                        *register = updated;
                        self.cached.clear();
                    }
                }
            }
            Repr::Sparse(tokens) => {
                if tokens.insert(sparse::token_of_hash(hash)) {
                    self.cached.clear();
                    if tokens.indices() > sparse_limit(self.precision) {
                        self.repr = Repr::Dense(self.registers_at(self.precision));
                    }
                }
            }
        }
    }

    /// The estimated number of distinct items, with its standard error and 95% interval.
    pub fn estimate(&self) -> Estimate {
        // 0.761/√m is the asymptotic error of the ML estimate; below a few m items (and
        // always while sparse) the true error is smaller, so the interval is conservative
        // there.
        self.estimate_with(
            &self.cached,
            || self.raw_estimate(),
            |estimate, registers| {
                estimate * estimate::RELATIVE_ERROR_SQRT_M / (registers as f64).sqrt()
            },
        )
    }

    /// The maximum-likelihood estimate, without the cache.
    fn raw_estimate(&self) -> f64 {
        match &self.repr {
            Repr::Sparse(tokens) => {
                let mut histogram = [0u32; 256];
                for (_, r) in tokens.registers() {
                    histogram[usize::from(r)] += 1;
                }
                // At most m/4 ≤ 2^16 indices, so the empty count fits and is positive.
                histogram[0] = (sparse::SPARSE_REGISTERS - tokens.indices() as u64) as u32;
                estimate::maximum_likelihood(&histogram, SPARSE_PRECISION, sparse::SPARSE_REGISTERS)
            }
            Repr::Dense(registers) => estimate::maximum_likelihood(
                &registers::histogram(registers),
                self.precision,
                1 << self.precision,
            ),
        }
    }

    /// The HyperLogLog of the same items at the same precision, exactly: equal, register
    /// for register or entry for entry, to the [`Hll`] built by inserting them.
    pub fn to_hll(&self) -> Hll {
        match &self.repr {
            Repr::Sparse(tokens) => {
                let mut hll = Hll::new(self.precision).expect("the precision was checked");
                // A hash with the token's index and rank makes the same sparse entry, and
                // the HyperLogLog keeps the largest rank of each index.
                tokens.for_each(|token| hll.insert_hash(sparse::hash_of_token(token)));
                hll
            }
            Repr::Dense(registers) => Hll::from_dense_registers(
                self.precision,
                registers.iter().map(|&r| r >> 2).collect(),
            ),
        }
    }

    /// Appends the body (docs/FORMAT.md, representations 2 and 3 of the distinct kind) to
    /// `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        self.write_body(out);
    }

    /// Reads a body written by [`Ull::encode_body`], validating every field; any other
    /// input is an error naming the field, never a panic.
    pub fn decode_body(body: &[u8]) -> Result<Ull, DecodeError> {
        Ull::read_body(body)
    }

    /// Checks a body exactly as [`Ull::decode_body`] does, without building the sketch.
    pub fn validate_body(body: &[u8]) -> Result<(), DecodeError> {
        let mut reader = BodyReader::new(body);
        let (precision, representation) = Ull::read_header(&mut reader)?;
        match representation {
            REPRESENTATION_SPARSE => drop(read_sparse(&mut reader, precision)?),
            _ => drop(read_dense(&mut reader, precision)?),
        }
        reader.finish()
    }
}

/// An UltraLogLog register remembers the largest update value and the two below it:
/// sketches unite by the union of what their registers remember, and the dense body holds
/// each register as its byte.
impl SparseOrDense for Ull {
    type Sparse = SparseTokens;
    const SPARSE: u8 = REPRESENTATION_SPARSE;
    const DENSE: u8 = REPRESENTATION_DENSE;
    const EXPECTED: &'static str = "2 (UltraLogLog sparse) or 3 (UltraLogLog dense)";

    fn sparse_limit(precision: u8) -> usize {
        sparse_limit(precision)
    }

    state_fields!(SparseTokens);

    fn write_dense(registers: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(registers);
    }

    fn decode_sparse(
        reader: &mut BodyReader<'_>,
        precision: u8,
    ) -> Result<SparseTokens, DecodeError> {
        let (bytes, indices) = read_sparse(reader, precision)?;
        let list = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(SparseTokens::Sorted { list, indices })
    }

    fn decode_dense(reader: &mut BodyReader<'_>, precision: u8) -> Result<Box<[u8]>, DecodeError> {
        Ok(read_dense(reader, precision)?.into())
    }

    fn unite_into(&self, registers: &mut [u8], precision: u8) {
        match &self.repr {
            Repr::Sparse(tokens) => {
                tokens.for_each(|token| {
                    let (index, value) = sparse::dense_position(token, precision);
                    if let Some(register) = registers.get_mut(index) {
                        *register = registers::update(*register, value);
                    }
                });
            }
            Repr::Dense(mine) => registers::fold_into(registers, mine),
        }
    }
}

/// The token bytes of a sparse body, each checked: in one pass without branches on the
/// data for a valid body (what every push carries), and again token by token only to name
/// the fault of an invalid one. Returns them with their number of distinct indices.
fn read_sparse<'a>(
    reader: &mut BodyReader<'a>,
    precision: u8,
) -> Result<(&'a [u8], usize), DecodeError> {
    let count = reader.u32("sparse token count")? as usize;
    let limit = sparse_limit(precision);
    // At most three tokens per index.
    if count > 3 * limit {
        return Err(invalid(
            "sparse token count",
            format!(
                "{count} tokens, but a sparse sketch of precision {precision} holds at most {}",
                3 * limit
            ),
        ));
    }
    let bytes = reader.take(4 * count, "sparse tokens")?;
    let token = |i: usize| {
        u32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ])
    };
    // Valid: every index below 2^25 (the top bit clear), every rank in 1..=MAX, strictly
    // increasing, and within an index no rank three or more below the group's last
    // (largest) one. `bad` collects every violation as a set bit.
    let mut bad = 0u32;
    let mut indices = 0usize;
    let mut group_first_rank = 0u32;
    for i in 0..count {
        let t = token(i);
        let rank = sparse::rank_of(t);
        bad |= t >> 31;
        bad |= u32::from(rank == 0 || rank > sparse::MAX_SPARSE_RANK);
        let new_group = i == 0 || sparse::index_of(t) != sparse::index_of(token(i - 1));
        if i > 0 {
            bad |= u32::from(t <= token(i - 1));
        }
        if new_group {
            group_first_rank = rank;
            indices += 1;
        } else {
            bad |= u32::from(group_first_rank + 2 < rank);
        }
    }
    if bad == 0 && indices <= limit {
        return Ok((bytes, indices));
    }
    let tokens: Vec<u32> = (0..count).map(token).collect();
    Err(sparse_fault(&tokens, indices, precision))
}

/// What is wrong with the tokens of a sparse body that the one-pass check of
/// [`read_sparse`] refused, `indices` their number of distinct indices: the first token at
/// fault, or else their number.
fn sparse_fault(tokens: &[u32], indices: usize, precision: u8) -> DecodeError {
    let limit = sparse_limit(precision);
    for (i, &token) in tokens.iter().enumerate() {
        let (index, rank) = (sparse::index_of(token), sparse::rank_of(token));
        if u64::from(index) >= sparse::SPARSE_REGISTERS {
            return invalid(
                "sparse token",
                format!("token {i} has index {index}, above 2^{SPARSE_PRECISION} - 1"),
            );
        }
        if !(1..=sparse::MAX_SPARSE_RANK).contains(&rank) {
            return invalid(
                "sparse token",
                format!(
                    "token {i} has rank {rank}, outside 1..={}",
                    sparse::MAX_SPARSE_RANK
                ),
            );
        }
        if i > 0 && token <= tokens[i - 1] {
            return invalid(
                "sparse token",
                format!(
                    "token {i} is {token:#x} after {:#x}: tokens must strictly increase",
                    tokens[i - 1]
                ),
            );
        }
    }
    if let Some(i) = sparse::first_pruned(tokens) {
        return invalid(
            "sparse token",
            format!(
                "token {i} has rank {}, three or more below the largest of index {}",
                sparse::rank_of(tokens[i]),
                sparse::index_of(tokens[i])
            ),
        );
    }
    invalid(
        "sparse token count",
        format!(
            "{indices} indices, but a sketch of precision {precision} turns dense above {limit}"
        ),
    )
}

/// The `m` register bytes of a dense body, each checked.
fn read_dense<'a>(reader: &mut BodyReader<'a>, precision: u8) -> Result<&'a [u8], DecodeError> {
    let bytes = reader.take(1 << precision, "registers")?;
    if let Some((i, value)) = registers::first_invalid(bytes, precision) {
        return Err(invalid(
            "register",
            format!(
                "register {i} holds {value}, which no set of items makes at precision {precision} \
                 (largest value {}, and 1..=3, 5..=7, 9 and 11 never occur)",
                4 * (65 - u32::from(precision)) + 3
            ),
        ));
    }
    Ok(bytes)
}

impl Default for Ull {
    /// An empty sketch of [`DEFAULT_PRECISION`].
    fn default() -> Ull {
        Ull::empty(DEFAULT_PRECISION)
    }
}

#[cfg(test)]
mod tests;
