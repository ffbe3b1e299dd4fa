//! # hourglass-rpc
//!
//! What the three hourglass programs (`hourglass-agent`, `hourglass-aggregator` and the
//! `hourglass` command) share to speak and serve `package hourglass.v1`:
//!
//! | module | what |
//! |---|---|
//! | [`codec`] | the gRPC codec: prost messages, decoded from the received bytes in place |
//! | [`packed`] | many items in one bytes field (`SeriesBatch.packed_items`) |
//! | [`proto`] | the generated gRPC types (proto/hourglass/v1) and their conversions |
//! | [`series`] | metric, tag and series naming rules, checked where input enters |
//! | [`time`] | whole UTC hours, and how users write times and durations |
//! | [`selection`] | what a question selects, as flags and query strings write it, read into the wire's selector |
//! | [`tls`] | TLS for every listener and client (rustls), certificates reloaded on change |
//! | [`metrics`] | the Prometheus label sets both servers use |
//! | [`config`] | reading a server's config file, errors naming the file |
//! | [`process`] | logging, OpenTelemetry tracing and shutdown signals of every process |
//! | [`size_limit`] | messages refused for size, counted and named |
//!
//! The sketches themselves, and their binary format, are the `hourglass-sketch` crate,
//! which knows nothing of any of this. Nothing here knows RocksDB.

pub mod codec;
pub mod config;
pub mod metrics;
pub mod packed;
pub mod process;
pub mod proto;
pub mod selection;
pub mod series;
pub mod series_batch;
pub mod size_limit;
pub mod time;
pub mod tls;

/// A figure of an answer as JSON can carry it. JSON has no infinity (serde writes `null`,
/// where the API documents a number), so an unbounded figure (a saturated sketch's
/// estimate, error or upper end) is written as the largest finite number,
/// `1.7976931348623157e308`; NaN, which no answer should hold, as 0.
pub fn json_figure(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(f64::MIN, f64::MAX)
    }
}

/// Whether `x`, read back from JSON, is an unbounded figure ([`json_figure`]).
pub fn is_unbounded(x: f64) -> bool {
    x >= f64::MAX
}
