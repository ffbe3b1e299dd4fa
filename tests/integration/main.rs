//! Integration tests: the real binaries, run as a user would run them.

mod aggregator;
mod sketch_cli;
mod util;
