//! The expert-streaming settings ([`StreamConfig`], each field a `sluice run` flag) with their
//! named values and their check ([`StreamConfig::validate`]). What they decide for a model
//! (whether it streams, the cache budget) is [`crate::budget::decide`]; the source they set up is
//! [`crate::source::StoreSource::from_settings`].

use crate::error::{refuse, refused};
use crate::refusal::{ConfigError, Part, Problem, Refusal, Setting};
use std::path::PathBuf;

use crate::Choice as _;
use crate::error::{Error, Result};
use store::{Backend, EvictionPolicy, Forecast, IoMode, Lru, ReadFault};

/// How far the co-activation read-ahead (`--couple`) reaches: experts per layer and MoE
/// layers ahead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadAhead {
    pub k: usize,
    pub depth: u32,
}

/// How a run streams its experts (the front end's expert-streaming settings; each field's
/// meaning is the flag of the same name in `sluice run --help`).
#[derive(Debug, Clone)]
pub struct StreamConfig {
    pub moe_stream: StreamMode,
    pub cache_mb: Option<CacheMb>,
    pub cache_policy: CachePolicy,
    pub couple: Option<PathBuf>,
    pub couple_k: Option<usize>,
    pub couple_d: Option<u32>,
    pub cache_floor_mb: u64,
    pub cache_ceil_mb: u64,
    pub force_cache: bool,
    pub no_odirect: bool,
    pub io_threads: usize,
    pub io_backend: ReadBackend,
    pub overlap: bool,
    /// Prompt batches read the next MoE layer's experts ahead (`--prompt-ahead`).
    pub prompt_ahead: bool,
    /// A layer's routing known before its attention (SmallThinker's router reads the layer's
    /// input) is not loaded until after it (`--no-early-load`, for comparison).
    pub no_early_load: bool,
    pub dense_weights: Option<DenseWeights>,
    pub load_all: bool,
    pub inject_read_fault: Option<ReadFault>,
    /// `--prefetch K`: the previous token's experts of the next K MoE layers read ahead.
    pub prefetch: usize,
    /// `--predict-prefetch`: the stale gate's predicted misses of the next layer read ahead.
    pub predict_prefetch: bool,
    /// `--predict-spec-max N`: at most N predicted misses read ahead a layer (0: only keep the
    /// predicted residents); `None` the default, [`PREDICT_SPEC_MAX`].
    pub predict_spec_max: Option<usize>,
}

/// Predicted misses read ahead per layer by default under `--predict-prefetch`: the stall a
/// read ahead removes is the wait on a layer's first missing expert.
pub const PREDICT_SPEC_MAX: usize = 2;

impl Default for StreamConfig {
    /// What `sluice run` does without streaming flags.
    fn default() -> StreamConfig {
        StreamConfig {
            moe_stream: StreamMode::Auto,
            cache_mb: None,
            cache_policy: CachePolicy::DEFAULT,
            couple: None,
            couple_k: None,
            couple_d: None,
            cache_floor_mb: 1536,
            cache_ceil_mb: 0,
            force_cache: false,
            no_odirect: false,
            io_threads: 4,
            io_backend: ReadBackend::Pread,
            overlap: false,
            prompt_ahead: false,
            no_early_load: false,
            dense_weights: None,
            load_all: false,
            inject_read_fault: None,
            prefetch: 0,
            predict_prefetch: false,
            predict_spec_max: None,
        }
    }
}

/// `--cache-mb`: `auto` or MiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMb {
    Auto,
    Mib(u64),
}

impl std::str::FromStr for CacheMb {
    type Err = String;

    fn from_str(s: &str) -> Result<CacheMb, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(CacheMb::Auto);
        }
        s.parse::<u64>()
            .map(CacheMb::Mib)
            .map_err(|_| format!("`{s}` is neither `auto` nor a number of MiB"))
    }
}

/// A read fault from its spelling, `LAYER:EXPERT` (an I/O error) or `LAYER:EXPERT:short` (the
/// file ending inside the expert): `--inject-read-fault`.
pub fn parse_read_fault(s: &str) -> Result<ReadFault, String> {
    let bad = || format!("`{s}` is not LAYER:EXPERT or LAYER:EXPERT:short");
    let mut it = s.split(':');
    let layer = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let expert = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let short = match it.next() {
        None => false,
        Some("short") => true,
        Some(_) => return Err(bad()),
    };
    if it.next().is_some() {
        return Err(bad());
    }
    Ok(ReadFault {
        layer,
        expert,
        short,
    })
}

/// Below this, a fixed budget needs --force-cache (BigMoeOnEdge's `cache_min_mb`).
pub const CACHE_MIN_MB: u64 = 1500;

/// Whether the experts stream (`--moe-stream`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamMode {
    Auto,
    On,
    Off,
}

crate::choice!(StreamMode {
    Auto => "auto", "",
    On => "on", "",
    Off => "off", "",
});

/// How the I/O lanes read (`--io-backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadBackend {
    Pread,
    Uring,
    Auto,
}

crate::choice!(ReadBackend {
    Pread => "pread", "",
    Uring => "uring", "",
    Auto => "auto", "",
});

/// Where the dense weights live when streaming (`--dense-weights`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseWeights {
    Anon,
    Mmap,
    Warm,
}

crate::choice!(DenseWeights {
    Anon => "anon", "",
    Mmap => "mmap", "",
    Warm => "warm", "",
});

/// Which cached expert leaves first (`--cache-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachePolicy {
    Forecast,
    Lru,
    Adaptive,
}

crate::choice!(CachePolicy {
    Forecast => "forecast", "The one whose next use is forecast farthest away, from each expert's frequency and whether it was routed at its layer's last visit, and the layer cycle (store::policy::Forecast, docs/policy.md)",
    Lru => "lru", "The least recently used",
    Adaptive => "adaptive", "Forecast or LRU, whichever a shadow cache kept by each has hit more with lately (set dueling; store::policy::Adaptive, docs/policy.md)",
});

impl CachePolicy {
    /// What a run evicts by when not told otherwise.
    pub const DEFAULT: CachePolicy = CachePolicy::Adaptive;

    /// The policy object for a model whose MoE layers are `layers`, routing `k` of
    /// `n_expert` experts.
    pub fn build(self, layers: &[u32], k: u32, n_expert: u32) -> Box<dyn EvictionPolicy + Send> {
        match self {
            CachePolicy::Forecast => Box::new(Forecast::new(layers, k, n_expert)),
            CachePolicy::Lru => Box::new(Lru::default()),
            CachePolicy::Adaptive => Box::new(store::Adaptive::new(layers, k, n_expert)),
        }
    }
}

impl StreamConfig {
    /// Refuses flags that conflict, and budgets in the refused band (before anything is
    /// opened).
    pub fn validate(&self) -> Result<()> {
        if self.moe_stream == StreamMode::Off {
            let mut only_streaming = Vec::new();
            let flags = [
                (self.cache_mb.is_some(), Setting::CacheMb),
                (self.force_cache, Setting::ForceCache),
                (self.no_odirect, Setting::NoOdirect),
                (self.overlap, Setting::Overlap),
                (self.prompt_ahead, Setting::PromptAhead),
                (self.dense_weights.is_some(), Setting::DenseWeights),
                (self.load_all, Setting::LoadAll),
                (self.io_backend != ReadBackend::Pread, Setting::IoBackend),
                (self.inject_read_fault.is_some(), Setting::InjectReadFault),
                (self.prefetch > 0, Setting::Prefetch),
                (self.predict_prefetch, Setting::PredictPrefetch),
            ];
            for (set, flag) in flags {
                if set {
                    only_streaming.push(flag);
                }
            }
            if let Some(&first) = only_streaming.first() {
                let mut problem = Problem(Problem::join(&only_streaming, ", "));
                problem.0.extend([
                    Part::from(" only apply when streaming: they conflict with "),
                    Part::from(Setting::StreamMode),
                    Part::from(" off"),
                ]);
                return Err(Error::Rejected(Refusal::Setting(ConfigError {
                    setting: first,
                    problem,
                })));
            }
        }
        if self.io_threads == 0 || self.io_threads > 256 {
            refuse!(Setting::IoThreads; Setting::IoThreads, " must be 1 to 256");
        }
        let readers_ahead = [
            (self.prefetch > 0, Setting::Prefetch),
            (self.predict_prefetch, Setting::PredictPrefetch),
            (self.couple.is_some(), Setting::Couple),
        ];
        let on: Vec<Setting> = readers_ahead
            .iter()
            .filter(|(set, _)| *set)
            .map(|(_, f)| *f)
            .collect();
        if on.len() > 1 {
            let mut problem = Problem(Problem::join(&on, " and "));
            problem.0.push(Part::from(
                " each read ahead on their own prediction: give one of them",
            ));
            return Err(Error::Rejected(Refusal::Setting(ConfigError {
                setting: on[1],
                problem,
            })));
        }
        if self.predict_spec_max.is_some() && !self.predict_prefetch {
            refuse!(Setting::PredictSpecMax;
                Setting::PredictSpecMax,
                " sets ",
                Setting::PredictPrefetch,
                "'s reads: add ",
                Setting::PredictPrefetch,
            );
        }
        if self.load_all && !matches!(self.cache_mb, None | Some(CacheMb::Mib(0))) {
            refuse!(Setting::LoadAll;
                Setting::LoadAll,
                " reads every expert every time and keeps none: it conflicts with ",
                Setting::CacheMb,
                " (other than 0)",
            );
        }
        if let Some(CacheMb::Mib(mb)) = self.cache_mb
            && mb > 0
            && mb < CACHE_MIN_MB
            && !self.force_cache
        {
            refuse!(Setting::CacheMb;
                Setting::CacheMb,
                format!(
                    " {mb} is below {CACHE_MIN_MB} MiB, where an LRU expert cache is usually \
                     smaller than one token's experts and hits nothing: use 0 (no cache), a \
                     larger budget, auto, or "
                ),
                Setting::ForceCache,
            );
        }
        if self.io_backend == ReadBackend::Uring && !store::uring_available() {
            refuse!(Setting::IoBackend;
                Setting::IoBackend,
                " uring: io_uring is not available here (use pread or auto)",
            );
        }
        Ok(())
    }

    /// The `cache` field of the `mode:` line.
    pub fn cache_label(&self) -> String {
        if self.load_all {
            return "off".to_owned();
        }
        match self.cache_mb.unwrap_or(CacheMb::Auto) {
            CacheMb::Auto => "auto".to_owned(),
            CacheMb::Mib(0) => "off".to_owned(),
            CacheMb::Mib(mb) => format!("{mb} MiB"),
        }
    }

    /// The dense weights' placement when streaming.
    pub fn dense(&self) -> DenseWeights {
        self.dense_weights.unwrap_or(DenseWeights::Anon)
    }

    /// The `mode:` line of a streaming run.
    pub fn mode_line(&self, why: &str) -> String {
        let mut line = format!(
            "mode: expert streaming, cache {}, dense {}",
            self.cache_label(),
            self.dense().name()
        );
        if self.overlap {
            line.push_str(", overlap");
        }
        if !why.is_empty() {
            line.push_str(&format!(" ({why})"));
        }
        line
    }

    /// The lanes' backend (`auto`: the io_uring where it is available here).
    pub fn backend(&self) -> Backend {
        match self.io_backend {
            ReadBackend::Pread => Backend::Pread,
            ReadBackend::Uring => Backend::Uring,
            ReadBackend::Auto if store::uring_available() => Backend::Uring,
            ReadBackend::Auto => Backend::Pread,
        }
    }

    /// `--couple` (or COUPLE) with its K and depth (or COUPLE_K, COUPLE_D).
    pub fn couple_resolved(&self) -> Result<Option<(PathBuf, ReadAhead)>> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let Some(path) = self
            .couple
            .clone()
            .or_else(|| var("COUPLE").map(PathBuf::from))
        else {
            return Ok(None);
        };
        let k = match (self.couple_k, var("COUPLE_K")) {
            (Some(k), _) => k,
            (None, Some(v)) => v.trim().parse().map_err(|_| {
                refused!(Setting::CoupleKEnv;
                    Setting::CoupleKEnv,
                    format!("={v}: expected a number of experts"),
                )
            })?,
            (None, None) => 8,
        };
        let d = match (self.couple_d, var("COUPLE_D")) {
            (Some(d), _) => d,
            (None, Some(v)) => match v.trim() {
                "1" => 1,
                "2" => 2,
                _ => {
                    refuse!(Setting::CoupleDEnv; Setting::CoupleDEnv, format!("={v}: expected 1 or 2"))
                }
            },
            (None, None) => 1,
        };
        Ok(Some((path, ReadAhead { k, depth: d })))
    }

    /// How the lanes open the files: buffered under `--no-odirect`, else O_DIRECT where it works.
    pub fn io_mode(&self) -> IoMode {
        if self.no_odirect {
            IoMode::Buffered
        } else {
            IoMode::Auto
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicting_readers_ahead_and_streaming_settings_without_streaming_are_refused() {
        assert!(StreamConfig::default().validate().is_ok());
        // two readers ahead at once are refused, and so is a spec max without its reader
        let both = StreamConfig {
            prefetch: 2,
            predict_prefetch: true,
            ..StreamConfig::default()
        };
        assert!(both.validate().is_err());
        let lone = StreamConfig {
            predict_spec_max: Some(1),
            ..StreamConfig::default()
        };
        assert!(lone.validate().is_err());
        let off = StreamConfig {
            moe_stream: StreamMode::Off,
            prefetch: 1,
            ..StreamConfig::default()
        };
        assert!(off.validate().is_err());
        let off = StreamConfig {
            moe_stream: StreamMode::Off,
            prompt_ahead: true,
            ..StreamConfig::default()
        };
        assert!(off.validate().is_err());
    }

    #[test]
    fn a_fixed_budget_in_the_refused_band_needs_force_cache() {
        let small = StreamConfig {
            cache_mb: Some(CacheMb::Mib(CACHE_MIN_MB - 1)),
            ..StreamConfig::default()
        };
        assert!(matches!(small.validate(), Err(Error::Rejected(_))));
        let forced = StreamConfig {
            force_cache: true,
            ..small.clone()
        };
        assert!(forced.validate().is_ok());
        for mb in [0, CACHE_MIN_MB] {
            let ok = StreamConfig {
                cache_mb: Some(CacheMb::Mib(mb)),
                ..StreamConfig::default()
            };
            assert!(ok.validate().is_ok(), "{mb}");
        }
        let load_all = StreamConfig {
            load_all: true,
            cache_mb: Some(CacheMb::Mib(CACHE_MIN_MB)),
            ..StreamConfig::default()
        };
        assert!(load_all.validate().is_err());
    }

    #[test]
    fn cache_mb_and_read_faults_are_read_from_their_spelling() {
        assert_eq!("AUTO".parse::<CacheMb>(), Ok(CacheMb::Auto));
        assert_eq!("64".parse::<CacheMb>(), Ok(CacheMb::Mib(64)));
        assert!("64M".parse::<CacheMb>().is_err());
        assert_eq!(
            parse_read_fault("3:17:short"),
            Ok(ReadFault {
                layer: 3,
                expert: 17,
                short: true
            })
        );
        assert_eq!(parse_read_fault("3:17").map(|f| f.short), Ok(false));
        for bad in ["3", "3:x", "3:17:long", "3:17:short:1"] {
            assert!(parse_read_fault(bad).is_err(), "{bad}");
        }
    }
}
