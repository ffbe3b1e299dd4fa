//! # hourglass-aggregator
//!
//! The aggregator keeps every sketch the agents ship, in RocksDB, keyed by series, hour and
//! server, and answers queries over any time range and any subset of servers by merging
//! them (DESIGN §4–§5).
//!
//! This crate is a library; the process (`main.rs`) only parses its configuration and
//! calls into it. Its layers, each understandable alone:
//!
//! | module | what it is |
//! |---|---|
//! | [`keys`] | the encoding of every storage key: fixed-width big-endian fields, so byte order is time order and one series' week is one range scan |
//! | [`store`] | storage behind the [`store::Store`] trait: upsert of snapshots by version, rollups, retention, the series dictionary and server registry, server liveness; [`store::RocksStore`] for production, [`store::MemoryStore`] for tests |
//! | [`planner`] | which hourly rows and rollups answer a selection, merged in the one order that makes both give the same bytes |
//! | [`rollup`] | the builder of daily rollups for closed and late-touched days |
//! | [`glob`] | shell-style server name globs |
//!
//! Sketches are stored as their framed encoding (docs/FORMAT.md) and decoded with
//! [`hourglass::sketch::Sketch`]; the layout on disk and the RocksDB options are
//! explained in docs/STORAGE.md.

pub mod glob;
pub mod keys;
pub mod planner;
pub mod rollup;
pub mod store;
