//! Typed refusals: what the runtime declines to do, said in its own terms.
//!
//! A refusal names the runtime's settings as [`Setting`]s, never as a front end's spelling of
//! them: a [`Problem`] is a sentence whose parts are text and settings, and each front end
//! renders the settings its own way ([`Problem::render`]) — the CLI as its flags or environment
//! variables, `serve` as its JSON fields, the runtime's own `Display` as the settings' stable
//! dotted names ([`Setting::name`]). A caller tells refusals apart by [`Refusal`]'s variant,
//! not by their text.

use std::borrow::Cow;
use std::fmt;

/// A runtime setting a refusal can name. [`Setting::name`] is its stable dotted name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Setting {
    /// The context length in tokens.
    Context,
    /// The routed experts per token (lossy when below the model's own).
    NExpertUsed,
    /// Whether the experts stream from the store or stay resident.
    StreamMode,
    /// The expert cache's budget.
    CacheMb,
    /// A cache budget below the usual minimum, accepted anyway.
    ForceCache,
    /// Reads through the page cache instead of direct I/O.
    NoOdirect,
    /// Expert reads overlapped with compute.
    Overlap,
    /// The prompt's expert reads issued ahead of its layers.
    PromptAhead,
    /// Where the dense (non-expert) weights live.
    DenseWeights,
    /// Every expert read on every token, none kept.
    LoadAll,
    /// The read backend (pread, io_uring).
    IoBackend,
    /// A deliberate read fault, for tests.
    InjectReadFault,
    /// The number of read threads.
    IoThreads,
    /// Reads ahead on the previous token's routing.
    Prefetch,
    /// Reads ahead on the predicted routing.
    PredictPrefetch,
    /// The most predicted experts read ahead.
    PredictSpecMax,
    /// Reads ahead on a coupling table (the setting).
    Couple,
    /// The coupling's experts per token, from the environment.
    CoupleKEnv,
    /// The coupling's depth, from the environment.
    CoupleDEnv,
    /// Experts pinned in the cache (the setting).
    Pin,
    /// Experts pinned in the cache, from the environment.
    PinEnv,
    /// The pinned budget in GB, from the environment.
    PinGbEnv,
    /// How fast the usage history forgets.
    UsageDecay,
    /// The routing trace file.
    RouteTrace,
    /// The routing stream file (the setting).
    RouteTraceStream,
    /// The routing stream file, from the environment.
    RouteTraceEnv,
    /// The prediction log.
    PredictLog,
    /// The expert store's read trace.
    IoTrace,
    /// Drops cold experts from the routing (lossy).
    DropColdExperts,
    /// Substitutes resident experts in the routing (lossy).
    ExpertSubstitute,
    /// Replays a recorded routing (lossy).
    RouteReplay,
    /// Commits the routing to an early ranking (lossy).
    RouteAhead,
    /// Speculative decoding drafted by n-gram lookup.
    Ngram,
    /// The n-gram draft's minimum match.
    NgramMinMatch,
    /// Speculative decoding drafted by the model's MTP head.
    Mtp,
    /// The MTP draft's minimum probability.
    MtpPMin,
    /// Tokens drafted per verify pass.
    Draft,
    /// The sampler's seed.
    Seed,
    /// A session that answers decide requests.
    Decide,
}

impl Setting {
    /// Every setting (for tests and front ends that map them all).
    pub const ALL: [Setting; 39] = [
        Setting::Context,
        Setting::NExpertUsed,
        Setting::StreamMode,
        Setting::CacheMb,
        Setting::ForceCache,
        Setting::NoOdirect,
        Setting::Overlap,
        Setting::PromptAhead,
        Setting::DenseWeights,
        Setting::LoadAll,
        Setting::IoBackend,
        Setting::InjectReadFault,
        Setting::IoThreads,
        Setting::Prefetch,
        Setting::PredictPrefetch,
        Setting::PredictSpecMax,
        Setting::Couple,
        Setting::CoupleKEnv,
        Setting::CoupleDEnv,
        Setting::Pin,
        Setting::PinEnv,
        Setting::PinGbEnv,
        Setting::UsageDecay,
        Setting::RouteTrace,
        Setting::RouteTraceStream,
        Setting::RouteTraceEnv,
        Setting::PredictLog,
        Setting::IoTrace,
        Setting::DropColdExperts,
        Setting::ExpertSubstitute,
        Setting::RouteReplay,
        Setting::RouteAhead,
        Setting::Ngram,
        Setting::NgramMinMatch,
        Setting::Mtp,
        Setting::MtpPMin,
        Setting::Draft,
        Setting::Seed,
        Setting::Decide,
    ];

    /// The setting's stable dotted name (`group.setting`), what the runtime's own messages
    /// say.
    pub fn name(self) -> &'static str {
        match self {
            Setting::Context => "model.context",
            Setting::NExpertUsed => "model.n_expert_used",
            Setting::StreamMode => "stream.mode",
            Setting::CacheMb => "stream.cache_mb",
            Setting::ForceCache => "stream.force_cache",
            Setting::NoOdirect => "stream.no_odirect",
            Setting::Overlap => "stream.overlap",
            Setting::PromptAhead => "stream.prompt_ahead",
            Setting::DenseWeights => "stream.dense_weights",
            Setting::LoadAll => "stream.load_all",
            Setting::IoBackend => "stream.io_backend",
            Setting::InjectReadFault => "stream.inject_read_fault",
            Setting::IoThreads => "stream.io_threads",
            Setting::Prefetch => "stream.prefetch",
            Setting::PredictPrefetch => "stream.predict_prefetch",
            Setting::PredictSpecMax => "stream.predict_spec_max",
            Setting::Couple => "stream.couple",
            Setting::CoupleKEnv => "stream.couple_k (environment)",
            Setting::CoupleDEnv => "stream.couple_d (environment)",
            Setting::Pin => "history.pin",
            Setting::PinEnv => "history.pin (environment)",
            Setting::PinGbEnv => "history.pin_gb (environment)",
            Setting::UsageDecay => "history.usage_decay",
            Setting::RouteTrace => "recording.route_trace",
            Setting::RouteTraceStream => "recording.route_stream",
            Setting::RouteTraceEnv => "recording.route_stream (environment)",
            Setting::PredictLog => "recording.predict_log",
            Setting::IoTrace => "recording.io_trace",
            Setting::DropColdExperts => "lossy.drop_cold_experts",
            Setting::ExpertSubstitute => "lossy.expert_substitute",
            Setting::RouteReplay => "lossy.route_replay",
            Setting::RouteAhead => "lossy.route_ahead",
            Setting::Ngram => "spec.ngram",
            Setting::NgramMinMatch => "spec.ngram_min_match",
            Setting::Mtp => "spec.mtp",
            Setting::MtpPMin => "spec.mtp_p_min",
            Setting::Draft => "spec.draft",
            Setting::Seed => "sampling.seed",
            Setting::Decide => "session.decide",
        }
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One part of a [`Problem`]: words, or a setting a front end spells its own way.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Words, shown as they are.
    Text(String),
    /// A setting, shown as the front end names it.
    Setting(Setting),
}

impl From<Setting> for Part {
    fn from(s: Setting) -> Part {
        Part::Setting(s)
    }
}

impl From<String> for Part {
    fn from(s: String) -> Part {
        Part::Text(s)
    }
}

impl From<&str> for Part {
    fn from(s: &str) -> Part {
        Part::Text(s.to_owned())
    }
}

/// A sentence that says what is wrong, with the settings it names kept typed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Problem(pub Vec<Part>);

impl Problem {
    /// The sentence, with each setting spelled by `name`.
    pub fn render<'a>(&'a self, name: impl Fn(Setting) -> Cow<'a, str>) -> String {
        let mut s = String::new();
        for p in &self.0 {
            match p {
                Part::Text(t) => s.push_str(t),
                Part::Setting(x) => s.push_str(&name(*x)),
            }
        }
        s
    }

    /// The settings the sentence names, in order.
    pub fn settings(&self) -> impl Iterator<Item = Setting> + '_ {
        self.0.iter().filter_map(|p| match p {
            Part::Setting(s) => Some(*s),
            Part::Text(_) => None,
        })
    }

    /// `items` separated by `sep` (a list of settings in a sentence).
    pub fn join(items: &[Setting], sep: &str) -> Vec<Part> {
        let mut parts = Vec::new();
        for (i, s) in items.iter().enumerate() {
            if i > 0 {
                parts.push(Part::Text(sep.to_owned()));
            }
            parts.push(Part::Setting(*s));
        }
        parts
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(|s| Cow::Borrowed(s.name())))
    }
}

/// A setting refused: `setting` is the one to change, `problem` says why (naming it and any
/// other settings involved).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    /// The setting refused.
    pub setting: Setting,
    /// Why, as a sentence that names its settings.
    pub problem: Problem,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.problem.fmt(f)
    }
}

/// Why a request or configuration is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// A setting is out of range, or conflicts with another.
    Setting(ConfigError),
    /// The prompt (or text) does not fit the context: `tokens` of `n_ctx`.
    ContextFull {
        /// The prompt's tokens.
        tokens: usize,
        /// The context's length.
        n_ctx: usize,
        /// The sentence (it names [`Setting::Context`]).
        problem: Problem,
    },
    /// The prompt has no tokens.
    EmptyPrompt,
    /// Any other request the runtime cannot take (the message says why).
    Request(String),
}

impl Refusal {
    /// The refusal's sentence, with each setting spelled by `name`.
    pub fn render<'a>(&'a self, name: impl Fn(Setting) -> Cow<'a, str>) -> String {
        match self {
            Refusal::Setting(c) => c.problem.render(name),
            Refusal::ContextFull { problem, .. } => problem.render(name),
            Refusal::EmptyPrompt => "the prompt is empty (no tokens)".to_owned(),
            Refusal::Request(msg) => msg.clone(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(|s| Cow::Borrowed(s.name())))
    }
}

impl From<ConfigError> for Refusal {
    fn from(c: ConfigError) -> Refusal {
        Refusal::Setting(c)
    }
}

/// A [`Problem`] from parts: settings and anything that becomes text.
macro_rules! problem {
    ($($part:expr),+ $(,)?) => {
        $crate::refusal::Problem(vec![$($crate::refusal::Part::from($part)),+])
    };
}

pub(crate) use problem;
