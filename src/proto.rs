//! Generated types of the public gRPC API, `package hourglass.v1` (proto/hourglass/v1).
//!
//! `build.rs` generates the code into `OUT_DIR`; this is the one module that includes it.
//! Conversions between these messages and the library's types live beside it.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("hourglass.v1");
}

/// The encoded `FileDescriptorSet` of `hourglass.v1`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("hourglass_descriptor");

use crate::format::Kind;

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
