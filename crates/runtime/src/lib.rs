//! Generation as a library, for every front end (the `sluice` binary, a server, an app that
//! embeds the engine): opening a model with its resolved configuration ([`open`]: whether the
//! experts stream and the cache budget, decided by [`budget`] from the [`settings`] and what the
//! [`probes`] measure, and where the dense weights live), the engine's expert source over the
//! store ([`source`]), the per-token figures and the telemetry formats, the usage history and
//! pinning, and the policies of sessions and decisions.
//!
//! Nothing here parses arguments or writes to standard output or standard error: settings are
//! plain values, what the runtime has to say arrives as [`Notice`]s through the caller's
//! [`Notices`], and failures are typed ([`Error`], a refusal told apart from a failure).

pub mod budget;
pub mod cancel;
pub mod decide;
pub mod error;
pub mod events;
pub mod facts;
pub mod generate;
pub mod history;
pub mod load;
pub mod notice;
pub mod open;
pub mod predict;
pub mod probes;
pub mod prompt;
pub mod read;
pub mod refusal;
pub mod report;
pub mod routes;
pub mod score;
pub mod session;
pub mod settings;
pub mod sink;
pub mod source;
pub mod spec;
pub mod telemetry;
pub mod traces;

pub use error::{Context, Error, Result};
pub use notice::{Level, Notice, Notices};
pub use refusal::{ConfigError, Problem, Refusal, Setting};

/// A setting with a fixed set of named values (what a front end offers as a flag's choices).
pub trait Choice: Copy + Sized + 'static {
    /// Every value, in the order a front end lists them.
    const ALL: &'static [Self];

    /// The value's name (the flag's spelling).
    fn name(self) -> &'static str;

    /// What the value does, in one sentence (empty when the name says it).
    fn help(self) -> &'static str {
        ""
    }

    /// The value named `name`.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.name() == name)
    }
}

/// Implements [`Choice`] and `Display` for a fieldless enum: `choice!(Type { Variant =>
/// "name", "help", ... })`.
macro_rules! choice {
    ($ty:ident { $($variant:ident => $name:literal, $help:literal),+ $(,)? }) => {
        impl $crate::Choice for $ty {
            const ALL: &'static [$ty] = &[$($ty::$variant),+];

            fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }

            fn help(self) -> &'static str {
                match self {
                    $($ty::$variant => $help),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($crate::Choice::name(*self))
            }
        }
    };
}
pub(crate) use choice;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Pick {
        First,
        Second,
    }
    choice!(Pick {
        First => "first", "the first one",
        Second => "second", "",
    });

    #[test]
    fn a_choice_is_found_by_its_name_and_prints_it() {
        assert_eq!(Pick::from_name("second"), Some(Pick::Second));
        assert_eq!(Pick::from_name("Second"), None);
        assert_eq!(Pick::First.to_string(), "first");
        assert_eq!(Pick::First.help(), "the first one");
        assert_eq!(Pick::ALL, &[Pick::First, Pick::Second]);
    }
}
