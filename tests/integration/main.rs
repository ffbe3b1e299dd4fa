//! Integration tests: the real binaries, run as a user would run them.

mod agent;
mod aggregator;
mod background;
mod cluster;
mod demo;
mod faults;
mod http;
mod install_deps;
mod lag;
mod membership_range;
mod multicall;
mod nats;
mod natsfaults;
mod netcut;
mod otel;
mod robustness;
mod sets;
mod sketch_cli;
mod tls;
mod ull;
mod util;
