//! The Prometheus label sets both servers use (`hourglass-agent` and
//! `hourglass-aggregator` each keep a registry of their own; a label that means the same
//! on both is defined once, here).

use prometheus_client::encoding::EncodeLabelSet;

/// `outcome`: `ok`, or what failed (a gRPC code's name, as [`crate::proto::code_label`]
/// names it, or `error` for a background pass).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// The outcome.
    pub outcome: &'static str,
}

/// `reason`: why something was refused, dropped or lost (the rule a snapshot broke, the
/// cause of a lost batch).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The reason.
    pub reason: &'static str,
}

/// `method`: a gRPC method's path.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabel {
    /// The method.
    pub method: String,
}
