//! # hourglass
//!
//! Mergeable sketches for counting what happens across a fleet of servers, and everything
//! the agent, the aggregator and the `hourglass` command share: the sketches and their
//! binary format, item hashing, and the generated gRPC types of `package hourglass.v1`.
//!
//! This crate knows nothing of RocksDB or of serving (see DESIGN §6): it is the vocabulary
//! both sides speak.
//!
//! | kind | module | answers |
//! |---|---|---|
//! | distinct | [`sketch::hll`] | how many distinct items? |
//! | frequency | [`sketch::frequency`] | how often did X occur? what are the top K? |
//! | membership | [`sketch::bloom`] | was X seen? |

pub mod error;
pub mod format;
pub mod hash;
pub mod process;
pub mod proto;
pub mod series;
pub mod size_limit;
pub mod sketch;
pub mod time;
pub mod tls;

pub use error::{DecodeError, MergeError, ParameterError};
pub use format::Kind;
