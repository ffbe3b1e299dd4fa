//! # hourglass-sketch
//!
//! Mergeable sketches for counting what happens across a fleet, each answer with its
//! error bar, and the checksummed binary format they travel and rest in. This crate is
//! the vocabulary of hourglass and nothing else: no async runtime, no gRPC, no storage.
//! Its only dependencies are `xxhash-rust` (item hashing and frame checksums) and
//! `thiserror`.
//!
//! | kind | type | answers |
//! |---|---|---|
//! | distinct | [`distinct::Distinct`]: [`hll::Hll`] or [`ull::Ull`] | how many distinct items? (UltraLogLog: in ~28% fewer bytes at the same error) |
//! | frequency | [`frequency::Frequency`] | how often did X occur? what are the top K? |
//! | membership | [`bloom::Bloom`] | was X seen? |
//! | membership over a range | [`membership::lookup`], [`membership::RangeSizing`] | was X seen in any of these server-hours, and where, without merging the filters? |
//!
//! Every sketch type has the same shape: `insert` items, `merge` another sketch of the
//! same kind and parameters (an error naming the parameter otherwise), `encode` to the
//! framed binary format of docs/FORMAT.md and `decode` from it (an error, never a panic,
//! on any input). Items are hashed once with [`hash::item_hash`], so sketches built on
//! different hosts merge.
//!
//! How many distinct visitors, across two hosts:
//!
//! ```
//! use hourglass_sketch::hll::Hll;
//!
//! let mut web1 = Hll::new(14)?;
//! let mut web2 = Hll::new(14)?;
//! for user in 0..5_000u32 {
//!     web1.insert(format!("user-{user}").as_bytes());
//! }
//! for user in 2_500..10_000u32 {
//!     web2.insert(format!("user-{user}").as_bytes());
//! }
//! // Sketches travel as bytes; a decoder checks every length and the checksum.
//! let shipped = Hll::decode(&web2.encode())?;
//! web1.merge(&shipped)?;
//! let answer = web1.estimate();
//! assert!(answer.lower95 <= 10_000.0 && 10_000.0 <= answer.upper95);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! How often, and the top items:
//!
//! ```
//! use hourglass_sketch::frequency::{Frequency, FrequencyParams};
//!
//! let mut pages = Frequency::new(FrequencyParams::default())?;
//! pages.insert_weighted(b"/home", 300)?;
//! for _ in 0..20 {
//!     pages.insert(b"/about")?;
//! }
//! // Count-Min never undercounts, and overcounts by more than max_overcount (ε·N)
//! // with probability at most δ.
//! let home = pages.estimate(b"/home");
//! assert!(home.estimate >= 300 && home.estimate <= 300 + home.max_overcount);
//! assert_eq!(pages.top_k(1)[0].item, b"/home");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Was it seen:
//!
//! ```
//! use hourglass_sketch::bloom::Bloom;
//!
//! let mut seen = Bloom::new(10_000, 0.01)?;
//! seen.insert(b"order-42");
//! assert!(seen.contains(b"order-42")); // a Bloom filter has no false negatives
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod common;
pub mod error;
mod estimate;
pub mod format;
pub mod hash;
mod kind;

pub mod bloom;
pub mod countmin;
pub mod distinct;
pub mod frequency;
pub mod frequent;
pub mod hll;
pub mod membership;
pub mod overlap;
pub mod ull;

#[cfg(test)]
mod test_support;

pub use error::{DecodeError, MergeError, ParameterError};
pub use estimate::{Estimate, Z95};
pub use kind::Kind;

use crate::format::decode_frame;
use bloom::Bloom;
use distinct::Distinct;
use frequency::Frequency;

/// A sketch of any kind: what travels in a frame when the reader does not know the kind
/// in advance (exports, the `hourglass sketch` command, storage).
#[derive(Debug, Clone, PartialEq)]
pub enum Sketch {
    /// HyperLogLog or UltraLogLog.
    Distinct(Distinct),
    /// Count-Min with frequent items.
    Frequency(Frequency),
    /// Bloom filter.
    Membership(Bloom),
}

impl Sketch {
    /// The kind of sketch.
    pub fn kind(&self) -> Kind {
        match self {
            Sketch::Distinct(_) => Kind::Distinct,
            Sketch::Frequency(_) => Kind::Frequency,
            Sketch::Membership(_) => Kind::Membership,
        }
    }

    /// Adds one item. Only the frequency kind can refuse one (an item longer than its
    /// frequent-items summary stores).
    pub fn insert(&mut self, item: &[u8]) -> Result<(), ParameterError> {
        match self {
            Sketch::Distinct(s) => s.insert(item),
            Sketch::Frequency(s) => s.insert(item)?,
            Sketch::Membership(s) => s.insert(item),
        }
        Ok(())
    }

    /// Merges `other` into this sketch: an error if the kinds or parameters differ.
    pub fn merge(&mut self, other: &Sketch) -> Result<(), MergeError> {
        match (self, other) {
            (Sketch::Distinct(a), Sketch::Distinct(b)) => a.merge(b),
            (Sketch::Frequency(a), Sketch::Frequency(b)) => a.merge(b),
            (Sketch::Membership(a), Sketch::Membership(b)) => a.merge(b),
            (a, b) => Err(MergeError::KindMismatch {
                left: a.kind(),
                right: b.kind(),
            }),
        }
    }

    /// The framed encoding (docs/FORMAT.md).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Sketch::Distinct(s) => s.encode(),
            Sketch::Frequency(s) => s.encode(),
            Sketch::Membership(s) => s.encode(),
        }
    }

    /// Decodes a framed sketch of any kind.
    pub fn decode(bytes: &[u8]) -> Result<Sketch, DecodeError> {
        let (kind, body) = decode_frame(bytes)?;
        Ok(match kind {
            Kind::Distinct => Sketch::Distinct(Distinct::decode_body(body)?),
            Kind::Frequency => Sketch::Frequency(Frequency::decode_body(body)?),
            Kind::Membership => Sketch::Membership(Bloom::decode_body(body)?),
        })
    }

    /// Checks a framed sketch of any kind exactly as [`Sketch::decode`] does and returns
    /// its kind, building no sketch where the format allows: dense HyperLogLog and
    /// UltraLogLog registers are checked in place. For ingest paths that store the bytes
    /// as they came.
    pub fn validate(bytes: &[u8]) -> Result<Kind, DecodeError> {
        let (kind, body) = decode_frame(bytes)?;
        match kind {
            Kind::Distinct => Distinct::validate_body(body)?,
            Kind::Frequency => drop(Frequency::decode_body(body)?),
            Kind::Membership => drop(Bloom::decode_body(body)?),
        }
        Ok(kind)
    }

    /// Bytes of sketch state held in memory.
    pub fn size_bytes(&self) -> usize {
        match self {
            Sketch::Distinct(s) => s.size_bytes(),
            Sketch::Frequency(s) => s.size_bytes(),
            Sketch::Membership(s) => s.size_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One sketch of each kind, the distinct kind in both forms.
    fn one_of_each() -> [Sketch; 4] {
        let mut d = hll::Hll::new(12).unwrap();
        let mut u = ull::Ull::new(6).unwrap();
        let mut f =
            Frequency::new(frequency::FrequencyParams::from_error(0.01, 0.05).unwrap()).unwrap();
        let mut m = Bloom::new(100, 0.01).unwrap();
        for i in 0..50u32 {
            let item = i.to_le_bytes();
            d.insert(&item);
            u.insert(&item);
            f.insert(&item).unwrap();
            m.insert(&item);
        }
        [
            Sketch::Distinct(Distinct::Hll(d)),
            Sketch::Distinct(Distinct::Ull(u)),
            Sketch::Frequency(f),
            Sketch::Membership(m),
        ]
    }

    #[test]
    fn decode_dispatches_on_the_kind_byte() {
        for sketch in one_of_each() {
            let decoded = Sketch::decode(&sketch.encode()).unwrap();
            assert_eq!(decoded.kind(), sketch.kind());
            assert_eq!(decoded.encode(), sketch.encode());
        }
    }

    #[test]
    fn different_kinds_never_merge() {
        let sketches = one_of_each();
        for a in &sketches {
            for b in &sketches {
                let mut merged = a.clone();
                let result = merged.merge(b);
                if a.kind() == b.kind() {
                    assert!(result.is_ok());
                } else {
                    assert_eq!(
                        result.unwrap_err(),
                        MergeError::KindMismatch {
                            left: a.kind(),
                            right: b.kind()
                        }
                    );
                    assert_eq!(&merged, a, "a failed merge leaves the sketch as it was");
                }
            }
        }
    }

    /// The sketch `which` of [`one_of_each`], encoded, with each `(at, byte)` of `edits`
    /// written into its body (`at` modulo the body's length) and the frame made again
    /// around it, so its checksum holds and the damage reaches the kind's decoder.
    fn damaged(which: usize, edits: Vec<(usize, u8)>) -> Vec<u8> {
        let good = one_of_each()[which].encode();
        let (kind, body) = crate::format::decode_frame(&good).unwrap();
        let mut body = body.to_vec();
        for (at, byte) in edits {
            let at = at % body.len();
            body[at] = byte;
        }
        crate::format::encode_frame(kind, &body)
    }

    proptest! {
        /// Whatever the bytes, decoding any kind is an error or a sketch, never a panic.
        #[test]
        fn decoding_any_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = Sketch::decode(&bytes);
        }

        /// Validation accepts exactly what decoding accepts, for any damage.
        #[test]
        fn validate_agrees_with_decode(which in 0usize..4, edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4)) {
            let bytes = damaged(which, edits);
            prop_assert_eq!(Sketch::validate(&bytes).ok(), Sketch::decode(&bytes).ok().map(|s| s.kind()));
        }

        /// Valid frames whose bodies were damaged reach the kinds' validation (the checksum is
        /// recomputed) and still never panic.
        #[test]
        fn damaged_bodies_never_panic(which in 0usize..4, edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
            let _ = Sketch::decode(&damaged(which, edits));
        }
    }
}
