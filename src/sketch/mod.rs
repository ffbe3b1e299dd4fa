//! The three sketch kinds and what they share.
//!
//! Every sketch type has the same shape: `insert` items, `merge` another sketch of the
//! same kind and parameters (an error naming the parameter otherwise), `encode` to the
//! framed binary format of docs/FORMAT.md and `decode` from it (an error, never a panic,
//! on any input).

pub mod bloom;
pub mod countmin;
pub mod frequency;
pub mod frequent;
pub mod hll;

/// An estimate with its uncertainty: what every answer of hourglass carries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The point estimate.
    pub estimate: f64,
    /// Its standard error, in the same unit as the estimate.
    pub std_error: f64,
    /// Lower end of the 95% interval.
    pub lower95: f64,
    /// Upper end of the 95% interval.
    pub upper95: f64,
}

/// The two-sided 95% quantile of the normal distribution.
pub const Z95: f64 = 1.959_963_984_540_054;

impl Estimate {
    /// An estimate with a normal 95% interval, `estimate ± 1.96·std_error`, clamped below
    /// at `floor` (a count the sketch knows is certain, zero at least).
    pub fn normal(estimate: f64, std_error: f64, floor: f64) -> Estimate {
        Estimate {
            estimate,
            std_error,
            lower95: (estimate - Z95 * std_error).max(floor),
            upper95: estimate + Z95 * std_error,
        }
    }
}
