use std::path::PathBuf;

/// Errors reading a routing trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A line does not follow the format.
    #[error("{source_name}:{line}: {message}")]
    Malformed {
        /// The file name (or whatever name the caller gave the text).
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What was found and what was expected instead.
        message: String,
    },
}
