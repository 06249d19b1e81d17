//! The expert-use history of a run (`.coli_usage`, colibri's format, docs/history.md) and the
//! pinning it drives.
//!
//! Every routing a run makes is counted per (layer, expert) and added to the history file
//! next to the model (or `--usage-file`) after every generation, decayed by `--usage-decay`.
//! `--pin auto` (enough history) or `--pin FILE` pins the most used experts in the expert cache
//! at load: read once, never evicted. `--usage-prior` seeds the forecast eviction policy with
//! the history's counts. Reading and writing follow colibri's contract exactly (store::usage).

use crate::error::{refuse, refused};
use crate::refusal::Setting;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::Result;
use crate::notice::Notices;
use engine::{RouteTap, Routed};
use store::usage::{self, ReadOutcome, Usage};

/// Selections a history needs before `--pin auto` pins from it (colibri's auto-pin threshold).
pub const AUTO_PIN_MIN: u64 = 5000;

/// The history file's name next to the model.
pub const FILE_NAME: &str = ".coli_usage";

/// `--pin`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinArg {
    Off,
    Auto,
    File(PathBuf),
}

impl std::str::FromStr for PinArg {
    type Err = String;
    fn from_str(s: &str) -> Result<PinArg, String> {
        Ok(match s {
            "" => return Err("expected FILE, auto or off".into()),
            "off" => PinArg::Off,
            "auto" => PinArg::Auto,
            p => PinArg::File(PathBuf::from(p)),
        })
    }
}

/// The history's settings (each field is the `sluice run` flag of the same name).
#[derive(Debug, Clone, Default)]
pub struct HistoryConfig {
    pub usage_file: Option<PathBuf>,
    pub no_usage: bool,
    pub usage_decay: Option<f64>,
    pub pin: Option<PinArg>,
    pub pin_mb: Option<u64>,
    pub usage_prior: bool,
}

impl HistoryConfig {
    /// Fills what the flags leave open from colibri's environment variables.
    pub fn with_env(mut self) -> Result<HistoryConfig> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        if self.pin.is_none() {
            self.pin = match (var("PIN"), var("AUTOPIN")) {
                (Some(p), _) => Some(p.parse().map_err(
                    |e: String| refused!(Setting::PinEnv; Setting::PinEnv, format!(": {e}")),
                )?),
                (None, Some(a)) if a.trim() != "0" => Some(PinArg::Auto),
                _ => None,
            };
        }
        if self.pin_mb.is_none()
            && let Some(g) = var("PIN_GB")
        {
            let gb: f64 = g
                .trim()
                .parse()
                .map_err(|_| {
                    refused!(Setting::PinGbEnv; Setting::PinGbEnv, format!("={g}: not a number of GB"))
                })?;
            if !(gb >= 0.0 && gb.is_finite()) {
                refuse!(Setting::PinGbEnv; Setting::PinGbEnv, format!("={g}: not a number of GB"));
            }
            self.pin_mb = Some((gb * 1024.0).round() as u64);
        }
        match self.usage_decay {
            Some(d) if !(d > 0.0 && d <= 1.0) => {
                refuse!(Setting::UsageDecay;
                    Setting::UsageDecay,
                    format!(" {d}: expected a factor above 0 and at most 1"),
                )
            }
            Some(_) => {}
            None => {
                self.usage_decay = Some(usage::decay_from_env(var("COLI_USAGE_DECAY").as_deref()))
            }
        }
        Ok(self)
    }
}

/// A run's history: what was read, and the counts it adds.
pub struct History {
    path: PathBuf,
    engine: String,
    decay: f64,
    usage: Arc<Mutex<Usage>>,
    /// Whether the file may be written (not when it was refused: it is someone else's).
    save: bool,
    notices: Notices,
}

impl History {
    /// Reads the history of a model (`arch`, `n_layer` blocks, `n_expert` experts, MoE layers
    /// `moe_layers`); `None` with `--no-usage` or for a model without routed experts. Refusals
    /// and notices go to `notices`; nothing here fails the run.
    pub fn open(
        args: &HistoryConfig,
        model: &Path,
        arch: &str,
        n_layer: u32,
        n_expert: u32,
        moe_layers: &[u32],
        notices: &Notices,
    ) -> Option<History> {
        if args.no_usage || moe_layers.is_empty() || n_expert == 0 {
            return None;
        }
        let (path, trusted) = match &args.usage_file {
            Some(p) => (p.clone(), true),
            None => (
                model
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
                    .join(FILE_NAME),
                false,
            ),
        };
        let engine = usage::engine_name(arch);
        let mut u = Usage::new(n_layer, n_expert, moe_layers);
        let mut save = true;
        match usage::read_into(&path, &mut u, &engine, &[&engine], trusted) {
            Ok(ReadOutcome::Missing) => {}
            Ok(ReadOutcome::Loaded { accepted, notice }) => {
                if let Some(n) = notice {
                    notices.info(n);
                }
                notices.info(format!(
                    "sluice: usage history {}: {} selections of {} experts ({accepted} records)",
                    path.display(),
                    u.selections(),
                    u.distinct()
                ));
            }
            Ok(ReadOutcome::Refused(msg)) => {
                notices.warn(msg);
                notices.info(format!(
                    "sluice: not updating {}: it is not this model's history (--usage-file \
                     PATH to keep one elsewhere)",
                    path.display()
                ));
                save = false;
            }
            Err(e) => {
                notices.warn(format!(
                    "sluice: warning: cannot read the usage history: {e}"
                ));
                save = false;
            }
        }
        Some(History {
            path,
            engine,
            decay: args.usage_decay.unwrap_or(1.0),
            usage: Arc::new(Mutex::new(u)),
            save,
            notices: notices.clone(),
        })
    }

    /// The engine tap that counts every routed expert of every row.
    pub fn tap<'a>(&self) -> RouteTap<'a> {
        let usage = Arc::clone(&self.usage);
        Box::new(move |r: &Routed<'_>| {
            let mut u = usage.lock().unwrap_or_else(PoisonError::into_inner);
            for &id in r.ids {
                u.add(r.layer as u32, id as u32, 1);
            }
        })
    }

    /// The counts, most used first (ties: lowest layer, then expert).
    pub fn ranked(&self) -> Vec<((u32, u32), u64)> {
        let u = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        ranked(&u)
    }

    /// Selections the history holds.
    pub fn selections(&self) -> u64 {
        self.usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .selections()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the history (decayed) after a generation; a failure is a warning.
    pub fn save(&self) {
        if !self.save {
            return;
        }
        let mut u = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        match usage::save(&self.path, &mut u, &self.engine, self.decay) {
            Ok(line) => self.notices.info(line),
            Err(e) => self.notices.warn(format!(
                "sluice: warning: the usage history was not saved: {e}"
            )),
        }
    }
}

/// `u`'s non-zero counts, most used first (ties: lowest layer, then expert).
fn ranked(u: &Usage) -> Vec<((u32, u32), u64)> {
    let mut v: Vec<((u32, u32), u64)> = u.iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// What to pin: the experts in order and the bytes they may take.
pub struct PinPlan {
    pub keys: Vec<(u32, u32)>,
    pub max_bytes: u64,
    /// Where the ranking came from.
    pub source: PathBuf,
}

/// The pins of a streaming run with a cache of `budget` bytes, whose token cycle takes
/// `cycle` bytes of slots. `None`: nothing to pin (said why in a notice).
#[allow(clippy::too_many_arguments)]
pub fn plan(
    args: &HistoryConfig,
    history: Option<&History>,
    arch: &str,
    n_layer: u32,
    n_expert: u32,
    moe_layers: &[u32],
    budget: u64,
    cycle: u64,
    notices: &Notices,
) -> Result<Option<PinPlan>> {
    let spare = budget.saturating_sub(cycle);
    let explicit = args.pin_mb.map(|mb| mb << 20);
    let (keys, source, max_bytes) = match args.pin.as_ref().unwrap_or(&PinArg::Off) {
        PinArg::Off => return Ok(None),
        PinArg::Auto => {
            let Some(h) = history else {
                notices.info("sluice: --pin auto: no usage history (--no-usage): nothing pinned");
                return Ok(None);
            };
            if h.selections() < AUTO_PIN_MIN {
                notices.info(format!(
                    "sluice: --pin auto: the history holds {} selections, fewer than {AUTO_PIN_MIN}: \
                     nothing pinned yet",
                    h.selections()
                ));
                return Ok(None);
            }
            // Never below one token cycle of dynamic cache.
            let max = explicit.unwrap_or(spare / 2).min(spare);
            (h.ranked(), h.path().to_owned(), max)
        }
        PinArg::File(path) => {
            let engine = usage::engine_name(arch);
            let mut u = Usage::new(n_layer, n_expert, moe_layers);
            match usage::read_into(path, &mut u, &engine, &[&engine], true)? {
                ReadOutcome::Missing => refuse!(Setting::Pin;
                    Setting::Pin,
                    format!(" {}: no such file", path.display()),
                ),
                ReadOutcome::Refused(msg) => refuse!(Setting::Pin;
                    Setting::Pin,
                    format!(" {}: {msg}", path.display()),
                ),
                ReadOutcome::Loaded { notice, .. } => {
                    if let Some(n) = notice {
                        notices.info(n);
                    }
                }
            }
            // An explicit budget is the user's (within the cache).
            let max = explicit.unwrap_or(spare / 2).min(budget);
            (ranked(&u), path.clone(), max)
        }
    };
    if budget == 0 {
        notices.info("sluice: --pin: no expert cache (--cache-mb 0): nothing pinned");
        return Ok(None);
    }
    Ok(Some(PinPlan {
        keys: keys.into_iter().map(|(k, _)| k).collect(),
        max_bytes,
        source,
    }))
}
