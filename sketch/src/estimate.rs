//! An estimate with its uncertainty, as every answer of hourglass carries it: the point
//! estimate, its standard error and its 95% interval.

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
