//! The last point estimate of a sketch, remembered until its registers change: a query
//! asks a merged sketch for its estimate once or more, and the register pass is the
//! estimate's whole cost.

use std::sync::atomic::{AtomicU64, Ordering};

/// A point estimate remembered across calls, cleared whenever the sketch changes. Atomic
/// so that a `&` sketch stays shareable between threads; never part of equality.
#[derive(Debug)]
pub(crate) struct EstimateCache(AtomicU64);

/// No estimate is cached: a NaN pattern no estimate produces.
const NOT_CACHED: u64 = u64::MAX;

impl EstimateCache {
    /// A cache holding no estimate.
    pub(crate) fn empty() -> EstimateCache {
        EstimateCache(AtomicU64::new(NOT_CACHED))
    }

    /// The cached estimate, or `compute()`'s, which is then cached.
    pub(crate) fn get_or_compute(&self, compute: impl FnOnce() -> f64) -> f64 {
        match self.0.load(Ordering::Relaxed) {
            NOT_CACHED => {
                let estimate = compute();
                self.0.store(estimate.to_bits(), Ordering::Relaxed);
                estimate
            }
            bits => f64::from_bits(bits),
        }
    }

    /// Forgets the cached estimate: the sketch changed.
    pub(crate) fn clear(&mut self) {
        *self.0.get_mut() = NOT_CACHED;
    }
}

impl Clone for EstimateCache {
    /// A clone starts without a cached estimate: clones are made to be changed (merged
    /// into), and an empty cache is always correct.
    fn clone(&self) -> Self {
        EstimateCache::empty()
    }
}

impl PartialEq for EstimateCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for EstimateCache {}
