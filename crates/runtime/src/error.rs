//! The runtime's errors: a request or configuration it refuses before doing anything is a
//! [`Error::Rejected`]; anything that went wrong while doing it is a [`Error::Failed`] (with
//! the error that caused it as its source) or the engine's own [`Error::Forward`].

use std::fmt::Display;

/// What a runtime call returns on failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request or configuration is refused (conflicting settings, a value out of range, a
    /// prompt that does not fit): nothing was started, the caller may correct it and retry.
    #[error("{0}")]
    Rejected(crate::refusal::Refusal),
    /// The forward pass failed (or was cancelled).
    #[error(transparent)]
    Forward(#[from] engine::ForwardError),
    /// A library below failed (its own message, with its own causes).
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error(transparent)]
    Engine(#[from] engine::EngineError),
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Couple(#[from] store::couple::CoupleError),
    #[error(transparent)]
    Usage(#[from] store::UsageError),
    #[error(transparent)]
    Text(#[from] text::TextError),
    #[error(transparent)]
    Trace(#[from] telemetry::TraceError),
    #[error(transparent)]
    Chat(#[from] chat::ChatError),
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

    /// Whether this is a refusal of the request (as opposed to a failure while running it).
    pub fn is_rejected(&self) -> bool {
        matches!(self, Error::Rejected(_))
    }

    /// The refusal, when this is one.
    pub fn refusal(&self) -> Option<&crate::refusal::Refusal> {
        match self {
            Error::Rejected(r) => Some(r),
            _ => None,
        }
    }

    /// A refusal of a request that names no setting.
    pub fn request(msg: impl Into<String>) -> Error {
        Error::Rejected(crate::refusal::Refusal::Request(msg.into()))
    }
}

/// An error's message followed by those of its causes, `: `-separated (what a caller shows
/// as one line).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The runtime's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Says what was being done when an error happened: the error becomes the source of a
/// [`Error::Failed`] with the given message (printed as `message: cause` by a caller that
/// shows the chain).
pub trait Context<T> {
    fn context(self, msg: impl Display) -> Result<T>;
    fn with_context<M: Display>(self, f: impl FnOnce() -> M) -> Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Context<T> for std::result::Result<T, E> {
    fn context(self, msg: impl Display) -> Result<T> {
        self.map_err(|e| Error::Failed {
            msg: msg.to_string(),
            source: Some(Box::new(e)),
        })
    }

    fn with_context<M: Display>(self, f: impl FnOnce() -> M) -> Result<T> {
        self.map_err(|e| Error::Failed {
            msg: f().to_string(),
            source: Some(Box::new(e)),
        })
    }
}

/// Returns early with an [`Error::Failed`] made from a format string.
macro_rules! fail {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::failed(format!($($arg)*)))
    };
}

/// Returns early with an [`Error::Rejected`] of a request (a refusal that names no setting)
/// made from a format string.
macro_rules! reject {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::request(format!($($arg)*)))
    };
}

/// A [`ConfigError`](crate::refusal::ConfigError) refusal of `setting` as an [`crate::Error`] (not returned).
macro_rules! refused {
    ($setting:expr; $($part:expr),+ $(,)?) => {
        $crate::error::Error::Rejected($crate::refusal::Refusal::Setting(
            $crate::refusal::ConfigError {
                setting: $setting,
                problem: $crate::refusal::problem!($($part),+),
            },
        ))
    };
}

/// Returns early with a [`ConfigError`](crate::refusal::ConfigError) refusal of `setting`.
macro_rules! refuse {
    ($setting:expr; $($part:expr),+ $(,)?) => {
        return Err($crate::error::refused!($setting; $($part),+))
    };
}

pub(crate) use {fail, refuse, refused, reject};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_puts_its_message_before_the_cause() {
        let r: std::result::Result<(), std::io::Error> =
            Err(std::io::Error::new(std::io::ErrorKind::NotFound, "gone"));
        let e = r.context("cannot read x").unwrap_err();
        assert!(!e.is_rejected());
        assert_eq!(chain(&e), "cannot read x: gone");
        let nested: Result<()> = Err(e);
        let e = nested.with_context(|| "opening the model").unwrap_err();
        assert_eq!(chain(&e), "opening the model: cannot read x: gone");
    }

    #[test]
    fn a_refusal_is_told_apart_from_a_failure() {
        fn refuse() -> Result<()> {
            reject!("the text is {} token(s); scoring needs at least 2", 1)
        }
        fn break_down() -> Result<()> {
            fail!("lane {} died", 3)
        }
        let r = refuse().unwrap_err();
        assert!(r.is_rejected());
        assert_eq!(
            r.to_string(),
            "the text is 1 token(s); scoring needs at least 2"
        );
        let f = break_down().unwrap_err();
        assert!(!f.is_rejected());
        assert_eq!(chain(&f), "lane 3 died");
    }
}
