//! Generated types of the public gRPC API, `package hourglass.v1` (proto/hourglass/v1).
//!
//! `build.rs` generates the code into `OUT_DIR`; this is the one module that includes it.
//! Conversions between these messages and the library's types live beside it.

/// The byte buffer type of `bytes` fields (`EncodedSketch.data`, `Event.item`).
pub use prost::bytes::Bytes;

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("hourglass.v1");

    pub use crate::series_batch::{Items, SeriesBatch, Tag};
}

/// The encoded `FileDescriptorSet` of `hourglass.v1`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("hourglass_descriptor");

use hourglass_sketch::Kind;

/// The name of an overlap verdict (`v1::OverlapVerdict`) in JSON answers, the HTTP API's
/// and `hourglass query overlap --json`'s alike: `estimable`, `too_small`, `empty`,
/// `saturated`, or `unspecified` for a value this build does not know.
pub fn overlap_verdict_name(verdict: i32) -> &'static str {
    match v1::OverlapVerdict::try_from(verdict) {
        Ok(v1::OverlapVerdict::Estimable) => "estimable",
        Ok(v1::OverlapVerdict::TooSmall) => "too_small",
        Ok(v1::OverlapVerdict::Empty) => "empty",
        Ok(v1::OverlapVerdict::Saturated) => "saturated",
        _ => "unspecified",
    }
}

/// The metric label of a gRPC status code: snake case, as Prometheus labels go.
pub fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

impl v1::Server {
    /// A server named `name` with `labels` (key, value), as the wire carries it.
    pub fn with_labels(name: &str, labels: &[(String, String)]) -> v1::Server {
        v1::Server {
            name: name.to_string(),
            labels: labels
                .iter()
                .map(|(key, value)| v1::Tag {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
        }
    }
}

impl From<Kind> for v1::SketchKind {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::Distinct => v1::SketchKind::Distinct,
            Kind::Frequency => v1::SketchKind::Frequency,
            Kind::Membership => v1::SketchKind::Membership,
        }
    }
}

impl TryFrom<v1::SketchKind> for Kind {
    type Error = String;

    fn try_from(kind: v1::SketchKind) -> Result<Self, Self::Error> {
        match kind {
            v1::SketchKind::Distinct => Ok(Kind::Distinct),
            v1::SketchKind::Frequency => Ok(Kind::Frequency),
            v1::SketchKind::Membership => Ok(Kind::Membership),
            v1::SketchKind::Unspecified => Err("sketch kind is unspecified".to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_both_ways_with_matching_codes() {
        for kind in Kind::ALL {
            let wire = v1::SketchKind::from(kind);
            // The proto enum's numbers are the frame's kind codes, so logs agree.
            assert_eq!(wire as i32, i32::from(kind.code()));
            assert_eq!(Kind::try_from(wire).unwrap(), kind);
        }
        assert!(Kind::try_from(v1::SketchKind::Unspecified).is_err());
    }
}
