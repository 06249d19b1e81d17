//! What the runtime has to say while it works (what it loaded, how the experts are read, a
//! budget that will not hit, the context filling up): events handed to the caller, who decides
//! whether and where to show them. The library itself never prints.

use std::sync::Arc;

/// How much a notice matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// What was done or decided (a load, a plan, a backend chosen).
    Info,
    /// Progress of a long step (reading the dense weights), repeated about once a second.
    Progress,
    /// Something the caller asked for that will not work as they may expect.
    Warning,
}

/// One event: its level and its text, a whole line without the newline (the binary prints it
/// to standard error as it is).
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    pub level: Level,
    pub text: String,
    /// How much of the step is done (0 to 1), for a progress notice that knows.
    pub fraction: Option<f64>,
}

/// Where notices go: a callback that may be called from the thread that opened the model or
/// ran the generation, shared by everything the runtime sets up.
#[derive(Clone)]
pub struct Notices(Arc<dyn Fn(&Notice) + Send + Sync>);

impl Notices {
    /// Notices handed to `f`.
    pub fn new(f: impl Fn(&Notice) + Send + Sync + 'static) -> Notices {
        Notices(Arc::new(f))
    }

    /// Notices dropped.
    pub fn silent() -> Notices {
        Notices::new(|_| {})
    }

    fn send(&self, level: Level, text: String) {
        (self.0)(&Notice {
            level,
            text,
            fraction: None,
        });
    }

    pub fn info(&self, text: impl Into<String>) {
        self.send(Level::Info, text.into());
    }

    pub fn progress(&self, text: impl Into<String>) {
        self.send(Level::Progress, text.into());
    }

    /// A progress notice of a step `done` of `all` through (any one unit).
    pub fn progress_of(&self, text: impl Into<String>, done: u64, all: u64) {
        (self.0)(&Notice {
            level: Level::Progress,
            text: text.into(),
            fraction: (all > 0).then(|| (done as f64 / all as f64).min(1.0)),
        });
    }

    pub fn warn(&self, text: impl Into<String>) {
        self.send(Level::Warning, text.into());
    }
}

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Notices")
    }
}

impl Default for Notices {
    fn default() -> Notices {
        Notices::silent()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn notices_reach_the_callback_in_order_with_their_level() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&got);
        let n = Notices::new(move |n| sink.lock().unwrap().push(n.clone()));
        let m = n.clone();
        n.info("loaded");
        m.warn("small cache");
        n.progress("reading 1 of 2");
        m.progress_of("reading 3 of 4", 3, 4);
        let got = got.lock().unwrap();
        let want = [
            (Level::Info, "loaded", None),
            (Level::Warning, "small cache", None),
            (Level::Progress, "reading 1 of 2", None),
            (Level::Progress, "reading 3 of 4", Some(0.75)),
        ];
        assert_eq!(got.len(), want.len());
        for (g, (level, text, fraction)) in got.iter().zip(want) {
            assert_eq!(
                (g.level, g.text.as_str(), g.fraction),
                (level, text, fraction)
            );
        }
    }
}
