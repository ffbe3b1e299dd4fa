//! The hourglass agent library.
