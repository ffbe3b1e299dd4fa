//! The countmin module; filled by its own change.
