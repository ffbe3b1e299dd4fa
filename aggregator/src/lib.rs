//! The hourglass aggregator library.
