//! Bloom filter.
