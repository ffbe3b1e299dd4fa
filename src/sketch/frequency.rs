//! The frequency module; filled by its own change.
