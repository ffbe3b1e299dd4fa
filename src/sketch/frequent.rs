//! The frequent module; filled by its own change.
