//! The budget decision of a run: whether its experts stream and how many bytes the expert cache
//! may hold, from the streaming settings, the model file's sizes and the memory probed
//! ([`decide`]). A pure function of plain values: the probing is [`crate::probes`]'s, the
//! opening [`crate::open::open_for`]'s.

use crate::error::Result;
use crate::error::refused;
use crate::probes::MemoryFacts;
use crate::refusal::Setting;
use crate::settings::stream::{CACHE_MIN_MB, CacheMb, StreamConfig, StreamMode};
use store::ExpertLayout;

const MIB: u64 = 1 << 20;

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// What the decision needs of a model file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileFacts {
    /// The model's size in bytes.
    pub file_bytes: u64,
    /// Its routed experts, when they can be streamed (`None` for a model without any, or
    /// whose experts cannot be streamed).
    pub experts: Option<ExpertFacts>,
}

/// What the decision needs of a model's routed experts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertFacts {
    /// The bytes of the dense weights (everything but the streamed experts), which stay in
    /// memory while the experts stream.
    pub dense_bytes: u64,
    /// What cache slots for every expert take, padding for aligned reads included (what the
    /// cache charges): no budget needs more.
    pub slot_bytes_total: u64,
}

impl ExpertFacts {
    /// The facts of the experts laid out as `layout`.
    pub fn of(layout: &ExpertLayout) -> ExpertFacts {
        ExpertFacts {
            dense_bytes: layout.dense_bytes,
            slot_bytes_total: layout.slot_bytes_total(),
        }
    }
}

/// Whether a run streams, why, and the expert cache's budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub stream: bool,
    /// Why, for the `mode:` line (empty when a flag said so).
    pub why: String,
    /// The expert cache's budget in bytes (0 when not streaming, or streaming without a cache).
    pub cache_bytes: u64,
}

/// Whether to stream the model `file` describes, and with what cache budget, as `settings` say
/// with `memory` available.
///
/// The experts stream as `moe_stream` says, or under `auto` when the model is larger than the
/// available memory minus the floor (never for a model without routed experts, nor when the
/// available memory is unknown). When they stream, the cache holds `cache_mb` MiB, or under
/// `auto` what the available memory leaves after the floor and the dense weights — at least
/// [`CACHE_MIN_MB`], at most what every expert's slot takes and the ceiling; none under
/// `load_all`. A budget whose bytes overflow is refused.
pub fn decide(settings: &StreamConfig, file: &FileFacts, memory: &MemoryFacts) -> Result<Decision> {
    let (stream, why) = stream_or_not(settings, file, memory);
    let cache_bytes = match (stream, &file.experts) {
        (true, Some(experts)) => cache_bytes(settings, experts, memory)?,
        _ => 0,
    };
    Ok(Decision {
        stream,
        why,
        cache_bytes,
    })
}

/// Whether to stream, and why (see [`decide`]).
fn stream_or_not(
    settings: &StreamConfig,
    file: &FileFacts,
    memory: &MemoryFacts,
) -> (bool, String) {
    let size = file.file_bytes;
    match (settings.moe_stream, &file.experts) {
        (StreamMode::Off, _) => (false, String::new()),
        (StreamMode::On, _) => (true, String::new()),
        (StreamMode::Auto, None) => (false, String::new()),
        (StreamMode::Auto, Some(_)) => {
            let floor = settings.cache_floor_mb.saturating_mul(MIB);
            match memory.available() {
                Some(a) => {
                    let room = a.saturating_sub(floor);
                    (
                        size > room,
                        format!(
                            "auto: model {:.2} GiB {} available {:.2} GiB - floor {:.2} GiB",
                            gib(size),
                            if size > room { ">" } else { "<=" },
                            gib(a),
                            gib(floor)
                        ),
                    )
                }
                None => (false, "auto: available memory unknown".to_owned()),
            }
        }
    }
}

/// The cache budget in bytes for `experts` (`auto` resolved from the available memory).
fn cache_bytes(
    settings: &StreamConfig,
    experts: &ExpertFacts,
    memory: &MemoryFacts,
) -> Result<u64> {
    if settings.load_all {
        return Ok(0);
    }
    match settings.cache_mb.unwrap_or(CacheMb::Auto) {
        CacheMb::Mib(mb) => mb.checked_mul(MIB).ok_or_else(
            || refused!(Setting::CacheMb; Setting::CacheMb, format!(" {mb} is too large")),
        ),
        CacheMb::Auto => {
            let min = CACHE_MIN_MB * MIB;
            let want = match memory.available() {
                Some(avail) => avail
                    .saturating_sub(settings.cache_floor_mb.saturating_mul(MIB))
                    .saturating_sub(experts.dense_bytes)
                    .max(min),
                None => min,
            };
            // (At most what slots for every expert take, padding for aligned reads
            // included: what the cache charges.)
            let mut budget = want.min(experts.slot_bytes_total);
            if settings.cache_ceil_mb > 0 {
                budget = budget.min(settings.cache_ceil_mb.saturating_mul(MIB));
            }
            Ok(budget)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// A model of `gib` GiB whose experts' slots take `slots` bytes beside `dense` bytes of
    /// dense weights.
    fn model(gib: u64, dense: u64, slots: u64) -> FileFacts {
        FileFacts {
            file_bytes: gib * GIB,
            experts: Some(ExpertFacts {
                dense_bytes: dense,
                slot_bytes_total: slots,
            }),
        }
    }

    fn memory(available: u64) -> MemoryFacts {
        MemoryFacts {
            mem_available: Some(available),
            cgroup_available: None,
        }
    }

    fn auto() -> StreamConfig {
        StreamConfig::default()
    }

    #[test]
    fn a_model_that_fits_beside_the_floor_runs_resident() {
        let d = decide(&auto(), &model(10, GIB, 8 * GIB), &memory(32 * GIB)).unwrap();
        assert_eq!(
            d,
            Decision {
                stream: false,
                why: "auto: model 10.00 GiB <= available 32.00 GiB - floor 1.50 GiB".to_owned(),
                cache_bytes: 0,
            }
        );
        // exactly the room left by the floor still fits
        let room = 32 * GIB - auto().cache_floor_mb * MIB;
        let exact = FileFacts {
            file_bytes: room,
            ..model(0, GIB, 8 * GIB)
        };
        assert!(!decide(&auto(), &exact, &memory(32 * GIB)).unwrap().stream);
        let over = FileFacts {
            file_bytes: room + 1,
            ..exact
        };
        assert!(decide(&auto(), &over, &memory(32 * GIB)).unwrap().stream);
    }

    #[test]
    fn a_model_larger_than_the_memory_streams_with_a_cache_sized_to_what_is_left() {
        let slots = 40 * GIB;
        let d = decide(&auto(), &model(40, 2 * GIB, slots), &memory(16 * GIB)).unwrap();
        assert!(d.stream);
        assert_eq!(
            d.why,
            "auto: model 40.00 GiB > available 16.00 GiB - floor 1.50 GiB"
        );
        // available - floor - dense weights
        assert_eq!(d.cache_bytes, 16 * GIB - 1536 * MIB - 2 * GIB);
        // never more than every expert's slot takes, nor than the ceiling
        let small = decide(&auto(), &model(40, 2 * GIB, 3 * GIB), &memory(16 * GIB)).unwrap();
        assert_eq!(small.cache_bytes, 3 * GIB);
        let ceiled = StreamConfig {
            cache_ceil_mb: 4096,
            ..auto()
        };
        let d = decide(&ceiled, &model(40, 2 * GIB, slots), &memory(16 * GIB)).unwrap();
        assert_eq!(d.cache_bytes, 4 * GIB);
    }

    #[test]
    fn the_cgroup_limit_counts_when_it_is_the_smaller() {
        let capped = MemoryFacts {
            mem_available: Some(64 * GIB),
            cgroup_available: Some(8 * GIB),
        };
        let d = decide(&auto(), &model(10, GIB, 10 * GIB), &capped).unwrap();
        assert!(d.stream);
        assert_eq!(
            d.why,
            "auto: model 10.00 GiB > available 8.00 GiB - floor 1.50 GiB"
        );
        assert_eq!(d.cache_bytes, 8 * GIB - 1536 * MIB - GIB);
    }

    #[test]
    fn an_auto_cache_never_falls_below_the_minimum_budget() {
        let on = StreamConfig {
            moe_stream: StreamMode::On,
            ..auto()
        };
        let min = CACHE_MIN_MB * MIB;
        // the floor and the dense weights take more than is available
        let d = decide(&on, &model(40, 4 * GIB, 40 * GIB), &memory(2 * GIB)).unwrap();
        assert_eq!(d.cache_bytes, min);
        // the available memory unknown
        let d = decide(&on, &model(40, 4 * GIB, 40 * GIB), &MemoryFacts::default()).unwrap();
        assert_eq!(d.cache_bytes, min);
        // (but never more than every expert's slot)
        let d = decide(&on, &model(1, GIB, 100 * MIB), &memory(2 * GIB)).unwrap();
        assert_eq!(d.cache_bytes, 100 * MIB);
    }

    #[test]
    fn the_settings_override_auto() {
        let big = model(40, GIB, 40 * GIB);
        let off = StreamConfig {
            moe_stream: StreamMode::Off,
            ..auto()
        };
        let d = decide(&off, &big, &memory(GIB)).unwrap();
        assert_eq!((d.stream, d.why.as_str(), d.cache_bytes), (false, "", 0));
        let fixed = StreamConfig {
            moe_stream: StreamMode::On,
            cache_mb: Some(CacheMb::Mib(64)),
            ..auto()
        };
        let d = decide(&fixed, &model(1, GIB, 8 * GIB), &memory(64 * GIB)).unwrap();
        assert_eq!(
            (d.stream, d.why.as_str(), d.cache_bytes),
            (true, "", 64 * MIB)
        );
        let none = StreamConfig {
            cache_mb: Some(CacheMb::Mib(0)),
            ..fixed.clone()
        };
        assert_eq!(decide(&none, &big, &memory(GIB)).unwrap().cache_bytes, 0);
        let load_all = StreamConfig {
            load_all: true,
            cache_mb: None,
            ..fixed
        };
        assert_eq!(
            decide(&load_all, &big, &memory(GIB)).unwrap().cache_bytes,
            0
        );
    }

    #[test]
    fn without_streamable_experts_auto_runs_resident_and_so_does_unknown_memory() {
        let dense_only = FileFacts {
            file_bytes: 100 * GIB,
            experts: None,
        };
        let d = decide(&auto(), &dense_only, &memory(GIB)).unwrap();
        assert_eq!((d.stream, d.why.as_str(), d.cache_bytes), (false, "", 0));
        // `on` streams (opening it then fails), with no cache to size
        let on = StreamConfig {
            moe_stream: StreamMode::On,
            ..auto()
        };
        let d = decide(&on, &dense_only, &memory(GIB)).unwrap();
        assert_eq!((d.stream, d.cache_bytes), (true, 0));
        let d = decide(&auto(), &model(40, GIB, 40 * GIB), &MemoryFacts::default()).unwrap();
        assert_eq!(
            (d.stream, d.why.as_str()),
            (false, "auto: available memory unknown")
        );
    }

    #[test]
    fn a_budget_too_large_for_its_bytes_is_refused() {
        let huge = StreamConfig {
            moe_stream: StreamMode::On,
            cache_mb: Some(CacheMb::Mib(u64::MAX / 1024)),
            ..auto()
        };
        match decide(&huge, &model(1, GIB, GIB), &memory(GIB)) {
            Err(crate::Error::Rejected(crate::Refusal::Setting(c))) => {
                assert_eq!(c.setting, Setting::CacheMb);
                let msg = c.to_string();
                assert!(msg.ends_with("is too large"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
        // only when the experts stream: a resident run never sizes a cache
        let resident = StreamConfig {
            moe_stream: StreamMode::Off,
            ..huge
        };
        assert!(decide(&resident, &model(1, GIB, GIB), &memory(GIB)).is_ok());
    }
}
