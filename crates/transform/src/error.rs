//! The transforms' errors: options or an input a transform refuses before writing anything are
//! [`Error::Rejected`]; anything that fails while it works is an [`Error::Failed`] (with its
//! cause as the source) or the error of the library below.

use std::fmt::Display;

/// What a transform returns on failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The options or the input are refused (a value out of range, an architecture the
    /// transform does not know, a tensor type it cannot convert): nothing was written.
    #[error("{0}")]
    Rejected(String),
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error(transparent)]
    Quant(#[from] quant::QuantError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Something failed while it was being done: the message says what, the source why.
    #[error("{msg}")]
    Failed {
        msg: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
}

impl Error {
    /// A failure with no further cause.
    pub fn failed(msg: impl Into<String>) -> Error {
        Error::Failed {
            msg: msg.into(),
            source: None,
        }
    }

    /// Whether the options or the input were refused (as opposed to a failure while writing).
    pub fn is_rejected(&self) -> bool {
        matches!(self, Error::Rejected(_))
    }
}

/// The transforms' result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Says what was being done when an error happened (or what was missing, for an `Option`).
pub(crate) trait Context<T> {
    fn with_context<M: Display>(self, f: impl FnOnce() -> M) -> Result<T>;
    fn context(self, msg: impl Display) -> Result<T>
    where
        Self: Sized,
    {
        self.with_context(|| msg)
    }
}

impl<T, E: std::error::Error + Send + Sync + 'static> Context<T> for std::result::Result<T, E> {
    fn with_context<M: Display>(self, f: impl FnOnce() -> M) -> Result<T> {
        self.map_err(|e| Error::Failed {
            msg: f().to_string(),
            source: Some(Box::new(e)),
        })
    }
}

/// A missing value is a refusal of the input, with the message saying what is missing.
impl<T> Context<T> for Option<T> {
    fn with_context<M: Display>(self, f: impl FnOnce() -> M) -> Result<T> {
        self.ok_or_else(|| Error::Rejected(f().to_string()))
    }
}

/// Returns early with an [`Error::Failed`] made from a format string.
macro_rules! fail {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::failed(format!($($arg)*)))
    };
}

/// Returns early with an [`Error::Rejected`] made from a format string.
macro_rules! reject {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::Rejected(format!($($arg)*)))
    };
}

pub(crate) use {fail, reject};

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(e: &(dyn std::error::Error + 'static)) -> String {
        let mut s = e.to_string();
        let mut cur = e.source();
        while let Some(c) = cur {
            s = format!("{s}: {c}");
            cur = c.source();
        }
        s
    }

    #[test]
    fn a_context_goes_before_its_cause_and_a_missing_value_is_a_refusal() {
        let r: std::result::Result<(), std::io::Error> =
            Err(std::io::Error::new(std::io::ErrorKind::NotFound, "gone"));
        let e = r.context("cannot read x").unwrap_err();
        assert!(!e.is_rejected());
        assert_eq!(chain(&e), "cannot read x: gone");
        let e = None::<u32>
            .context("x: no general.architecture")
            .unwrap_err();
        assert!(e.is_rejected());
        assert_eq!(chain(&e), "x: no general.architecture");
    }
}
