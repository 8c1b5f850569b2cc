//! Why a configuration file cannot be used: every error names the setting (or the file) it is
//! about, and keeps its cause (an IO error, TOML's own error) as its source.

use std::path::PathBuf;

/// A configuration file that cannot be used, with the reason. The message says everything on
/// one line (the cause included, for the exit-64 line); [`std::error::Error::source`] still
/// gives the cause itself.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not TOML, or a table has a key or type the file format does not allow.
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    /// A setting is wrong; the message names it and says why.
    #[error("{0}")]
    Invalid(String),
    /// An error in the file at `path`.
    #[error("{}: {source}", path.display())]
    In {
        path: PathBuf,
        #[source]
        source: Box<FileError>,
    },
}

impl FileError {
    /// A wrong setting: `message` names it and says why.
    pub fn new(message: impl Into<String>) -> Self {
        Self::Invalid(message.into())
    }
}
