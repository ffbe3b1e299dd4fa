//! The two states of a distinct sketch, sparse tokens while small and one byte per
//! register once dense, and the moves between them that both sketches make alike: turning
//! dense past a limit, merging, folding to a lower precision, and the body's frame around
//! either state. Because the state is a function of the set of hashes alone, each of these
//! is exact in both sketches; what a token or a register means, and how two of them unite,
//! is each sketch's own ([`SparseSet`] and [`SparseOrDense`]).

use super::body;
use super::cache::EstimateCache;
use super::check_fold;
use super::sparse::SPARSE_REGISTERS;
use crate::error::{DecodeError, ParameterError};
use crate::estimate::Estimate;
use crate::format::BodyReader;
use std::borrow::Cow;

/// Where a distinct sketch keeps its hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Repr<S> {
    /// Tokens of the virtual sketch at the sparse precision.
    Sparse(S),
    /// `2^p` registers, one byte each.
    Dense(Box<[u8]>),
}

/// The sparse tokens of a sketch, as that sketch keeps them.
pub(crate) trait SparseSet: Default {
    /// Tokens from a canonical (sorted) list.
    fn from_canonical(tokens: Vec<u32>) -> Self;
    /// The canonical list: every token, sorted.
    fn canonical(&self) -> Cow<'_, [u32]>;
    /// The number of occupied indices, each at least one distinct item.
    fn occupied(&self) -> usize;
    /// The canonical union of two canonical lists.
    fn union(a: &[u32], b: &[u32]) -> Vec<u32>;
    /// Bytes held, for memory accounting.
    fn size_bytes(&self) -> usize;
}

/// The accessors of [`SparseOrDense`] for a sketch whose fields are `precision`, `repr`
/// (a [`Repr`] of `$sparse`) and `cached`, as both sketches' are.
macro_rules! state_fields {
    ($sparse:ty) => {
        fn from_parts(precision: u8, repr: $crate::common::state::Repr<$sparse>) -> Self {
            Self {
                precision,
                repr,
                cached: $crate::common::cache::EstimateCache::empty(),
            }
        }

        fn parts(&self) -> (u8, &$crate::common::state::Repr<$sparse>) {
            (self.precision, &self.repr)
        }

        fn parts_mut(
            &mut self,
        ) -> (
            &mut u8,
            &mut $crate::common::state::Repr<$sparse>,
            &mut $crate::common::cache::EstimateCache,
        ) {
            (&mut self.precision, &mut self.repr, &mut self.cached)
        }
    };
}
pub(crate) use state_fields;

/// The public methods both sketches have alike, for the sketch's own `impl` block: making
/// one, its precision and state, adding an item, merging, folding and its size, each a
/// check or a move of [`SparseOrDense`]. `$held` names what the sketch keeps while sparse
/// (HyperLogLog's entries, UltraLogLog's tokens), for the docs. The sketch's module has
/// `MIN_PRECISION` and `MAX_PRECISION`, and its own `insert_hash`.
macro_rules! shared_methods {
    ($held:literal) => {
        /// An empty sketch with `2^precision` registers; `precision` must be in
        /// [`MIN_PRECISION`]`..=`[`MAX_PRECISION`].
        pub fn new(precision: u8) -> Result<Self, $crate::error::ParameterError> {
            $crate::common::check_precision(precision)?;
            Ok(Self::empty(precision))
        }

        /// The precision `p`: the sketch has `2^p` registers once dense.
        pub fn precision(&self) -> u8 {
            self.precision
        }

        #[doc = concat!("Whether the sketch still holds sparse ", $held, " rather than registers.")]
        pub fn is_sparse(&self) -> bool {
            matches!(self.repr, $crate::common::state::Repr::Sparse(_))
        }

        /// Adds an item, hashed with [`crate::hash::item_hash`].
        #[inline]
        pub fn insert(&mut self, item: &[u8]) {
            self.insert_hash($crate::hash::item_hash(item));
        }

        /// Adds every item of `other`. The result has the smaller of the two precisions: a
        /// sketch of higher precision folds down exactly, so this never fails; the `Result`
        /// keeps the signature of every other sketch's merge.
        pub fn merge(&mut self, other: &Self) -> Result<(), $crate::error::MergeError> {
            self.merge_from(other);
            Ok(())
        }

        /// The sketch of the same items at a lower (or equal) precision. Exact: the result
        /// equals a sketch built at `precision` from the start.
        pub fn fold_to(&self, precision: u8) -> Result<Self, $crate::error::ParameterError> {
            self.fold_to_precision(precision)
        }

        #[doc = concat!("Bytes of the ", $held, " or registers held in memory, for memory accounting.")]
        pub fn size_bytes(&self) -> usize {
            self.held_bytes()
        }
    };
}
pub(crate) use shared_methods;

/// A distinct sketch, HyperLogLog or UltraLogLog: what each keeps its own, with the moves
/// between its states kept once as provided methods.
pub(crate) trait SparseOrDense: Sized {
    /// How the sketch keeps its sparse tokens.
    type Sparse: SparseSet;
    /// Representation byte of a sparse body.
    const SPARSE: u8;
    /// Representation byte of a dense body.
    const DENSE: u8;
    /// The two representation bytes, named for a decode error.
    const EXPECTED: &'static str;

    /// The most occupied indices a sketch of `precision` holds before it turns dense.
    fn sparse_limit(precision: u8) -> usize;
    /// A sketch of `precision` in `repr`, with no estimate cached ([`state_fields`]).
    fn from_parts(precision: u8, repr: Repr<Self::Sparse>) -> Self;
    /// The precision and the state ([`state_fields`]).
    fn parts(&self) -> (u8, &Repr<Self::Sparse>);
    /// The precision, the state and the cached estimate, to change ([`state_fields`]).
    fn parts_mut(&mut self) -> (&mut u8, &mut Repr<Self::Sparse>, &mut EstimateCache);
    /// Unites `registers` (at `precision`, not above this sketch's) with this sketch's
    /// registers at that precision.
    fn unite_into(&self, registers: &mut [u8], precision: u8);
    /// Appends dense `registers` in the body's encoding.
    fn write_dense(registers: &[u8], out: &mut Vec<u8>);
    /// Reads the tokens of a sparse body, each checked.
    fn decode_sparse(
        reader: &mut BodyReader<'_>,
        precision: u8,
    ) -> Result<Self::Sparse, DecodeError>;
    /// Reads the registers of a dense body, each checked.
    fn decode_dense(reader: &mut BodyReader<'_>, precision: u8) -> Result<Box<[u8]>, DecodeError>;

    /// An empty sketch of `precision`, which the caller has checked.
    fn empty(precision: u8) -> Self {
        Self::from_parts(precision, Repr::Sparse(Self::Sparse::default()))
    }

    /// A sketch from canonical tokens, dense if they occupy too many indices for
    /// `precision`.
    fn from_canonical(precision: u8, tokens: Vec<u32>) -> Self {
        let sketch = Self::from_parts(precision, Repr::Sparse(SparseSet::from_canonical(tokens)));
        match sketch.parts() {
            (_, Repr::Sparse(tokens)) if tokens.occupied() > Self::sparse_limit(precision) => {
                Self::from_parts(precision, Repr::Dense(sketch.registers_at(precision)))
            }
            _ => sketch,
        }
    }

    /// This sketch's registers at `precision`, which must not exceed its own.
    fn registers_at(&self, precision: u8) -> Box<[u8]> {
        let mut registers = super::registers::empty(precision);
        self.unite_into(&mut registers, precision);
        registers
    }

    /// Adds every item of `other`, at the smaller of the two precisions: sparse with
    /// sparse unite their tokens, anything else unites registers.
    fn merge_from(&mut self, other: &Self) {
        self.parts_mut().2.clear();
        let (theirs, other_repr) = other.parts();
        let (own, repr) = self.parts();
        let precision = own.min(theirs);
        if let (Repr::Sparse(mine), Repr::Sparse(theirs)) = (repr, other_repr) {
            let union = Self::Sparse::union(&mine.canonical(), &theirs.canonical());
            *self = Self::from_canonical(precision, union);
            return;
        }
        if matches!(repr, Repr::Sparse(_)) || own != precision {
            let registers = self.registers_at(precision);
            let (own, repr, _) = self.parts_mut();
            *repr = Repr::Dense(registers);
            *own = precision;
        }
        if let (_, Repr::Dense(registers), _) = self.parts_mut() {
            other.unite_into(registers, precision);
        }
    }

    /// The sketch of the same items at a lower (or equal) precision. Exact: the result
    /// equals a sketch built at `precision` from the start.
    fn fold_to_precision(&self, precision: u8) -> Result<Self, ParameterError> {
        let (own, repr) = self.parts();
        check_fold(own, precision)?;
        Ok(match repr {
            Repr::Sparse(tokens) => {
                Self::from_canonical(precision, tokens.canonical().into_owned())
            }
            Repr::Dense(_) => {
                Self::from_parts(precision, Repr::Dense(self.registers_at(precision)))
            }
        })
    }

    /// The estimate, `raw()` unless cached, with the standard error `std_error(estimate,
    /// registers)` and the interval's floor: `registers` is the virtual sketch's while
    /// sparse, `2^p` once dense, and the floor the occupied indices while sparse, each at
    /// least one distinct item.
    fn estimate_with(
        &self,
        cached: &EstimateCache,
        raw: impl FnOnce() -> f64,
        std_error: impl FnOnce(f64, u64) -> f64,
    ) -> Estimate {
        let (registers, floor) = match self.parts() {
            (_, Repr::Sparse(tokens)) => (SPARSE_REGISTERS, tokens.occupied() as f64),
            (precision, Repr::Dense(_)) => (1u64 << precision, 0.0),
        };
        let estimate = cached.get_or_compute(raw);
        Estimate::normal(estimate, std_error(estimate, registers), floor)
    }

    /// Bytes of the tokens or registers held in memory, for memory accounting.
    fn held_bytes(&self) -> usize {
        match self.parts() {
            (_, Repr::Sparse(tokens)) => tokens.size_bytes(),
            (_, Repr::Dense(registers)) => registers.len(),
        }
    }

    /// Appends the body (without the frame) to `out`.
    fn write_body(&self, out: &mut Vec<u8>) {
        match self.parts() {
            (precision, Repr::Sparse(tokens)) => {
                body::write_header(out, precision, Self::SPARSE);
                body::write_tokens(out, &tokens.canonical());
            }
            (precision, Repr::Dense(registers)) => {
                body::write_header(out, precision, Self::DENSE);
                Self::write_dense(registers, out);
            }
        }
    }

    /// The header of a body: precision and representation, each checked.
    fn read_header(reader: &mut BodyReader<'_>) -> Result<(u8, u8), DecodeError> {
        body::read_header(reader, [Self::SPARSE, Self::DENSE], Self::EXPECTED)
    }

    /// Reads a body (without the frame), validating every field.
    fn read_body(body: &[u8]) -> Result<Self, DecodeError> {
        let mut reader = BodyReader::new(body);
        let (precision, representation) = Self::read_header(&mut reader)?;
        let repr = if representation == Self::SPARSE {
            Repr::Sparse(Self::decode_sparse(&mut reader, precision)?)
        } else {
            Repr::Dense(Self::decode_dense(&mut reader, precision)?)
        };
        reader.finish()?;
        Ok(Self::from_parts(precision, repr))
    }
}
