//! What reading a config file means to both servers: the file is read whole, then parsed
//! by the server's own schema; either step failing is an error that names the file.
//! TOML and each schema stay with each server, which passes its parser in.

use std::fmt::Display;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why a config file cannot be loaded.
#[derive(Debug, Error)]
pub enum FileError {
    /// The file cannot be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid for the schema: not TOML, or an unknown or mistyped field.
    #[error("config file {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, which names the field and line, without its trailing
        /// newline.
        message: String,
    },
}

/// Reads the file at `path` and parses its text with `parse`.
pub fn read_file<T, E: Display>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text).map_err(|e| FileError::Parse {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().to_string(),
    })
}
