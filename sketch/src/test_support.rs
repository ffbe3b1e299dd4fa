//! Test-only helpers shared by the sketch modules' tests.

use proptest::prelude::*;

/// One edit of an encoded sketch, for decoders fed damaged bytes.
#[derive(Debug, Clone)]
pub(crate) enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

/// A random [`Mutation`], mostly bit flips.
pub(crate) fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 1u8..=255).prop_map(|(at, x)| Mutation::Flip(at, x)),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Mutation::Insert(at, b)),
        1 => any::<usize>().prop_map(Mutation::Remove),
        1 => any::<usize>().prop_map(Mutation::Truncate),
    ]
}

/// Applies `mutation` to `bytes` (positions wrap around its length).
pub(crate) fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let len = bytes.len();
    match *mutation {
        Mutation::Flip(at, x) if len > 0 => bytes[at % len] ^= x,
        Mutation::Insert(at, b) => bytes.insert(at % (len + 1), b),
        Mutation::Remove(at) if len > 0 => {
            bytes.remove(at % len);
        }
        Mutation::Truncate(at) => bytes.truncate(at % (len + 1)),
        _ => {}
    }
}
