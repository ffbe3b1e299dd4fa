//! Errors of the sketch library. Each variant carries what a user needs to fix the
//! problem; none of them is ever a panic.

use thiserror::Error;

/// Why a byte string is not a valid encoded sketch.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum DecodeError {
    /// The input ends before a field that must be there.
    #[error("truncated sketch: {what} needs {needed} bytes but only {available} remain")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left in the input.
        available: usize,
    },
    /// The input does not start with `HGSK`: it is not an hourglass sketch.
    #[error("not an hourglass sketch: magic is {found:02x?}, expected \"HGSK\"")]
    BadMagic {
        /// The first four bytes found.
        found: [u8; 4],
    },
    /// The sketch was written by a format version this build does not read.
    #[error("sketch format version {version} is not supported (this build reads version 1)")]
    UnsupportedVersion {
        /// The version byte found.
        version: u8,
    },
    /// The kind byte names no sketch kind.
    #[error("unknown sketch kind code {code} (expected 1 distinct, 2 frequency or 3 membership)")]
    UnknownKind {
        /// The kind byte found.
        code: u8,
    },
    /// The frame's length field disagrees with the bytes given.
    #[error("sketch length mismatch: header declares {declared} bytes, input has {actual}")]
    LengthMismatch {
        /// Total length implied by the header.
        declared: usize,
        /// Length of the input.
        actual: usize,
    },
    /// The bytes were changed after they were written.
    #[error(
        "sketch checksum mismatch: stored {stored:#018x}, computed {computed:#018x} (corrupted)"
    )]
    ChecksumMismatch {
        /// Checksum in the trailer.
        stored: u64,
        /// Checksum of the bytes received.
        computed: u64,
    },
    /// The body holds more bytes than its parameters account for.
    #[error("sketch body has {extra} unexpected trailing bytes")]
    TrailingBytes {
        /// Bytes left over.
        extra: usize,
    },
    /// A parameter or payload value is out of range or inconsistent.
    #[error("invalid sketch {field}: {reason}")]
    Invalid {
        /// The field at fault.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The frame holds a different kind of sketch than the caller asked for.
    #[error("expected a {expected} sketch, found a {found} sketch")]
    WrongKind {
        /// The kind asked for.
        expected: crate::kind::Kind,
        /// The kind in the frame.
        found: crate::kind::Kind,
    },
}

/// Why two sketches cannot be merged.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum MergeError {
    /// Different kinds never merge.
    #[error("cannot merge a {right} sketch into a {left} sketch")]
    KindMismatch {
        /// The kind merged into.
        left: crate::kind::Kind,
        /// The kind merged from.
        right: crate::kind::Kind,
    },
    /// A parameter that must match differs.
    #[error("cannot merge: {parameter} differs ({right} cannot merge into {left})")]
    ParameterMismatch {
        /// The parameter's name, as users know it (`precision`, `width`, ...).
        parameter: &'static str,
        /// Its value in the sketch merged into.
        left: String,
        /// Its value in the sketch merged from.
        right: String,
    },
}

/// Why sketch parameters are unusable.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("invalid {parameter} {value}: {reason}")]
pub struct ParameterError {
    /// The parameter's name as users know it.
    pub parameter: &'static str,
    /// The value given.
    pub value: String,
    /// The accepted range or rule.
    pub reason: String,
}

impl ParameterError {
    /// A parameter error for `parameter = value`, with the rule it breaks.
    pub fn new(parameter: &'static str, value: impl ToString, reason: impl Into<String>) -> Self {
        ParameterError {
            parameter,
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}
