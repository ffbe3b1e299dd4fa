//! What the aggregator's Push handler runs on untrusted bytes, without its RocksDB glue:
//! the protobuf decoding of a `PushRequest`, then for the server and each snapshot the
//! checks of the write path that the Collector's `push` runs (`aggregator/src/write/`:
//! `Writer::checked_request` and `check_snapshot`), built from the same library calls:
//!
//! - server labels: `series::validate_tag`;
//! - `Series::try_from(&v1::Series)`, and that an accepted series round-trips through its
//!   wire and text forms;
//! - `v1::SketchKind::try_from(i32)` then `Kind::try_from(v1::SketchKind)`, and that the
//!   wire number is the frame's kind code;
//! - `Sketch::validate` on the sketch bytes, agreeing with `Sketch::decode` and each
//!   kind's decoder, and a sketch that decodes passes every check of `check_sketch`.
//!
//! The glue itself (`check_snapshot`, limits, the store) is exercised by the aggregator's
//! integration tests.
#![no_main]

use hourglass_sketch::format::Kind;
use hourglass_rpc::proto::v1;
use hourglass_rpc::series::{self, Series};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = v1::PushRequest::decode(data) else {
        return;
    };
    if let Some(server) = &request.server {
        for label in &server.labels {
            let _ = series::validate_tag(&label.key, &label.value);
        }
    }
    for snapshot in &request.snapshots {
        if let Some(wire) = &snapshot.series
            && let Ok(series) = Series::try_from(wire)
        {
            hourglass_fuzz::check_series(&series);
        }
        let Some(sketch) = &snapshot.sketch else {
            continue;
        };
        let declared = v1::SketchKind::try_from(sketch.kind)
            .ok()
            .and_then(|wire| Kind::try_from(wire).ok());
        if let Some(kind) = declared {
            assert_eq!(i32::from(kind.code()), sketch.kind);
        }
        // Asserts that validation agrees with decoding, then checks the decoded sketch.
        hourglass_fuzz::check_frame(&sketch.data);
    }
});
