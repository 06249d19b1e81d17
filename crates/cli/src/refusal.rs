//! The CLI's wording of the runtime's refusals: each runtime [`Setting`] spelled as the flag
//! (or environment variable) that sets it.

use std::borrow::Cow;

use runtime::{Refusal, Setting};

/// The flag, or environment variable, that sets `s` on the command line.
pub fn flag(s: Setting) -> &'static str {
    match s {
        Setting::Context => "-c",
        Setting::NExpertUsed => "--n-expert-used",
        Setting::StreamMode => "--moe-stream",
        Setting::CacheMb => "--cache-mb",
        Setting::ForceCache => "--force-cache",
        Setting::NoOdirect => "--no-odirect",
        Setting::Overlap => "--overlap",
        Setting::PromptAhead => "--prompt-ahead",
        Setting::DenseWeights => "--dense-weights",
        Setting::LoadAll => "--load-all",
        Setting::IoBackend => "--io-backend",
        Setting::InjectReadFault => "--inject-read-fault",
        Setting::IoThreads => "--io-threads",
        Setting::Prefetch => "--prefetch",
        Setting::PredictPrefetch => "--predict-prefetch",
        Setting::PredictSpecMax => "--predict-spec-max",
        Setting::Couple => "--couple",
        Setting::CoupleKEnv => "COUPLE_K",
        Setting::CoupleDEnv => "COUPLE_D",
        Setting::Pin => "--pin",
        Setting::PinEnv => "PIN",
        Setting::PinGbEnv => "PIN_GB",
        Setting::UsageDecay => "--usage-decay",
        Setting::RouteTrace => "--route-trace",
        Setting::RouteTraceStream => "--route-trace-stream",
        Setting::RouteTraceEnv => "ROUTE_TRACE",
        Setting::PredictLog => "--predict-log",
        Setting::IoTrace => "--io-trace",
        Setting::DropColdExperts => "--drop-cold-experts",
        Setting::ExpertSubstitute => "--expert-substitute",
        Setting::RouteReplay => "--route-replay",
        Setting::RouteAhead => "--route-ahead",
        Setting::Ngram => "--ngram",
        Setting::NgramMinMatch => "--ngram-min-match",
        Setting::Mtp => "--mtp",
        Setting::MtpPMin => "--mtp-p-min",
        Setting::Draft => "--draft",
        Setting::Seed => "--seed",
        Setting::Decide => "--decide",
    }
}

/// A refusal as the CLI says it: its settings named by their flags.
pub fn render(r: &Refusal) -> String {
    r.render(|s| Cow::Borrowed(flag(s)))
}

/// A runtime error as one line, `: `-separated causes, a refusal in the CLI's words.
pub fn runtime_error(e: &runtime::Error) -> String {
    match e.refusal() {
        Some(r) => render(r),
        None => runtime::error::chain(e),
    }
}

/// An error and its causes as one line (what `{:#}` shows), with any runtime refusal in the
/// chain in the CLI's words.
pub fn error_text(e: &anyhow::Error) -> String {
    e.chain()
        .map(|c| match c.downcast_ref::<runtime::Error>() {
            Some(runtime::Error::Rejected(r)) => render(r),
            _ => c.to_string(),
        })
        .collect::<Vec<_>>()
        .join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtime::{ConfigError, Problem, refusal::Part};

    #[test]
    fn every_setting_has_its_own_flag() {
        let mut seen = std::collections::HashSet::new();
        for s in Setting::ALL {
            let f = flag(s);
            assert!(
                f.starts_with('-') || f.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
                "{s}: {f}"
            );
            assert!(seen.insert(f), "{f} is mapped twice");
        }
    }

    #[test]
    fn environment_settings_map_to_their_variables() {
        assert_eq!(flag(Setting::PinEnv), "PIN");
        assert_eq!(flag(Setting::PinGbEnv), "PIN_GB");
        assert_eq!(flag(Setting::CoupleKEnv), "COUPLE_K");
        assert_eq!(flag(Setting::RouteTraceEnv), "ROUTE_TRACE");
        assert_eq!(flag(Setting::Pin), "--pin");
    }

    #[test]
    fn a_refusal_names_its_settings_by_their_flags() {
        let r = Refusal::Setting(ConfigError {
            setting: Setting::NgramMinMatch,
            problem: Problem(vec![
                Part::Setting(Setting::Ngram),
                Part::Text(": ".into()),
                Part::Setting(Setting::NgramMinMatch),
                Part::Text(" must be at least 1".into()),
            ]),
        });
        assert_eq!(render(&r), "--ngram: --ngram-min-match must be at least 1");
        assert_eq!(
            r.to_string(),
            "spec.ngram: spec.ngram_min_match must be at least 1"
        );
    }

    #[test]
    fn a_refusal_inside_an_error_chain_is_in_the_clis_words() {
        let r = Refusal::Setting(ConfigError {
            setting: Setting::IoThreads,
            problem: Problem(vec![
                Part::Setting(Setting::IoThreads),
                Part::Text(" must be 1 to 256".into()),
            ]),
        });
        let e = anyhow::Error::from(runtime::Error::Rejected(r)).context("opening the model");
        assert_eq!(
            error_text(&e),
            "opening the model: --io-threads must be 1 to 256"
        );
        let plain = anyhow::anyhow!("gone").context("reading x");
        assert_eq!(error_text(&plain), format!("{plain:#}"));
    }
}
