//! Integration tests: the real binaries, run as a user would run them.

mod agent;
mod aggregator;
mod background;
mod cluster;
mod demo;
mod faults;
mod http;
mod http_review;
mod install_deps;
mod lag;
mod multicall;
mod nats;
mod natsfaults;
mod netcut;
mod otel;
mod review;
mod review2;
mod review3;
mod review4;
mod review5;
mod robustness;
mod sets;
mod sets_review;
mod sketch_cli;
mod tls;
mod util;
