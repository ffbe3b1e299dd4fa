//! HyperLogLog; filled by its own change.
