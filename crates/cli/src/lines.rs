//! The lines `sluice` prints for a generation, rendered from the runtime's events
//! ([`runtime::events`]) and counters: the end-of-run summary of `sluice run` and `--ppl`
//! (`generation:`, `compute:`, `moe-stream:`, `moe-cache:`, `moe-prefetch:`,
//! `moe-prompt-ahead:`, `moe-drop:`, `moe-substitute:`, the speculation, route-ahead and
//! `--predict-log` lines) and the per-token and per-generation `BMOE_*` lines of `--progress`
//! and `--session` (`BMOE_LOAD`, `BMOE_PROGRESS`, `BMOE_DONE`).

use std::time::Duration;

use runtime::events::{Summary, TokenRow, compute_residual};
use runtime::predict::{AheadFigures, MAX_SCORED};
use runtime::probes::Usage;
use runtime::source::StreamSnapshot;
use runtime::spec::{Source, SpecCounts};
use telemetry::bmoe_session::{self, Line};

const MIB: f64 = (1u64 << 20) as f64;

/// The `generation:` line of the summary: decode time only.
pub fn generation_line(n_tokens: usize, decode: Duration) -> String {
    if n_tokens == 0 {
        return "generation: 0 tokens, 0.000 s/token (0.00 tok/s)".to_owned();
    }
    let secs = decode.as_secs_f64();
    let per_token = secs / n_tokens as f64;
    let rate = if secs > 0.0 {
        n_tokens as f64 / secs
    } else {
        0.0
    };
    format!("generation: {n_tokens} tokens, {per_token:.3} s/token ({rate:.2} tok/s)")
}

/// The `compute:` line: CPU occupancy over the compute threads and major faults, per token.
pub fn compute_line(usage: &Usage, decode_s: f64, tokens: usize, threads: usize) -> String {
    let n = tokens.max(1) as f64;
    let cpu_tok = usage.cpu_ns as f64 / 1e9 / n;
    let wall_tok = decode_s / n;
    let pct = if wall_tok > 0.0 && threads > 0 {
        100.0 * cpu_tok / (wall_tok * threads as f64)
    } else {
        0.0
    };
    format!(
        "compute: {pct:.1}% CPU occupancy ({cpu_tok:.3} cpu-s/token over {threads} threads), {:.2} major faults/token",
        usage.majflt as f64 / n
    )
}

/// The `moe-stream:` and `moe-cache:` lines for the decode's counters `d` over `n_gen` tokens
/// that took `decode`.
pub fn stream_summary(
    d: &StreamSnapshot,
    n_gen: usize,
    decode: Duration,
    overlap: bool,
    cache: bool,
) -> Vec<String> {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let per_tok = |x: f64| if n_gen > 0 { x / n_gen as f64 } else { 0.0 };
    let io_s = d.io_ns as f64 / 1e9;
    let stall_s = d.stall_ns as f64 / 1e9;
    let mgmt_s = d.mgmt_ns as f64 / 1e9;
    let wall = decode.as_secs_f64();
    let compute = compute_residual(wall, io_s, stall_s, mgmt_s, overlap);
    let mut stream = format!(
        "moe-stream: read {:.1} MiB ({:.1} MiB/token), decode {:.3} s/token (compute {:.3} + \
         cache mgmt {:.3} + flash I/O {:.3} s/token, {:.0} MiB/s)",
        mib(d.read_bytes),
        per_tok(mib(d.read_bytes)),
        per_tok(wall),
        per_tok(compute),
        per_tok(mgmt_s),
        per_tok(io_s),
        if io_s > 0.0 {
            mib(d.read_bytes) / io_s
        } else {
            0.0
        }
    );
    if overlap {
        stream.push_str(&format!(", stall_s/tok={:.3}", per_tok(stall_s)));
    }
    let mut lines = vec![stream];
    // Present only when a cache is active.
    if cache {
        lines.push(format!(
            "moe-cache: {:.1}% hit, resident {:.1} MiB",
            d.hit_pct(),
            mib(d.resident_bytes)
        ));
    }
    lines
}

/// The `moe-prompt-ahead:` line of a run whose prompt batches read experts ahead
/// (`StoreSource::prompt_ahead`; decode and prefill counters pooled): what they read and how
/// many of those experts their layer then routed.
pub fn prompt_ahead_line(decode: &StreamSnapshot, prefill: &StreamSnapshot) -> Option<String> {
    let [n, bytes, hits] = pooled(decode, prefill, |s| {
        [s.prompt_ahead, s.prompt_ahead_bytes, s.prompt_ahead_hits]
    });
    (n > 0).then(|| {
        format!(
            "moe-prompt-ahead: {:.1} MiB read ahead for the next layer, {hits}/{n} experts used ({:.1}%)",
            bytes as f64 / MIB,
            store::cache::hit_pct(hits, n),
        )
    })
}

/// The `moe-prefetch:` line of a run whose reads ahead read anything (decode and prefill
/// counters pooled): how much it read and how many of its experts were then used, tagged with
/// the predictor (`tag`; none for `--prefetch`'s previous-token bet).
pub fn prefetch_line(
    decode: &StreamSnapshot,
    prefill: &StreamSnapshot,
    tag: &str,
) -> Option<String> {
    let [n, bytes, hits] = pooled(decode, prefill, |s| {
        [s.prefetches, s.prefetch_bytes, s.prefetch_hits]
    });
    (n > 0).then(|| {
        let tag = if tag.is_empty() {
            String::new()
        } else {
            format!(" [{tag}]")
        };
        format!(
            "moe-prefetch: {:.1} MiB speculative, {hits}/{n} experts useful ({:.1}%){tag}",
            bytes as f64 / MIB,
            store::cache::hit_pct(hits, n),
        )
    })
}

/// Counters `pick` takes from each snapshot, summed.
fn pooled<const N: usize>(
    a: &StreamSnapshot,
    b: &StreamSnapshot,
    pick: impl Fn(&StreamSnapshot) -> [u64; N],
) -> [u64; N] {
    let (x, y) = (pick(a), pick(b));
    std::array::from_fn(|i| x[i] + y[i])
}

/// The `moe-drop:` line of a run with cache-aware dropping at `frac` (`--drop-cold-experts`):
/// of the `routed` expert slots of the decode (the dropped ones included), how many were
/// dropped. The flag sets a threshold; this line is what the run traded.
pub fn drop_line(dropped: u64, routed: u64, frac: f32) -> String {
    let pct = store::cache::hit_pct(dropped, routed);
    format!(
        "moe-drop: {dropped}/{routed} routed experts dropped ({pct:.1}%), threshold {frac} x uniform"
    )
}

/// The `moe-substitute:` line of a run with cache-aware substitution at `lambda`
/// (`--expert-substitute`; a sluice line, not the spec's): of the routed slots it re-ranked,
/// how many it moved to a resident expert.
pub fn substitute_line(substituted: u64, reranked: u64, lambda: f32) -> String {
    let pct = store::cache::hit_pct(substituted, reranked);
    format!(
        "moe-substitute: {substituted}/{reranked} routed experts moved to a resident expert ({pct:.1}%), lambda {lambda}"
    )
}

/// The lines of the cache-aware policies `cfg` turns on: `moe-drop:` and `moe-substitute:`,
/// from their counts `c` over `routed` expert slots (the dropped ones included).
pub fn cache_aware_lines(
    cfg: &engine::CacheAware,
    c: &engine::CacheAwareCounts,
    routed: u64,
) -> Vec<String> {
    let mut lines = Vec::new();
    if cfg.drop_frac > 0.0 {
        lines.push(drop_line(c.dropped, routed, cfg.drop_frac));
    }
    if cfg.substitute > 0.0 {
        lines.push(substitute_line(c.substituted, c.reranked, cfg.substitute));
    }
    lines
}

/// `BMOE_LOAD {...}` of a token `row`, when experts were read for it.
pub fn load_line(row: &TokenRow) -> Option<String> {
    (row.read_bytes > 0).then(|| {
        Line::Load(bmoe_session::Load {
            mb: row.read_bytes as f64 / MIB,
            ms: row.io_ms,
        })
        .to_string()
    })
}

/// `BMOE_PROGRESS {...}` of a token `row`, with its text deltas.
pub fn progress_line(
    row: &TokenRow,
    reset: bool,
    delta_reasoning: &str,
    delta_text: &str,
) -> String {
    Line::Progress(bmoe_session::Progress {
        step: row.step as u64,
        steps: row.steps as u64,
        wall_ms: row.wall_ms,
        io_ms: row.io_ms,
        compute_ms: row.compute_ms,
        mgmt_ms: row.mgmt_ms,
        stall_ms: row.stall_ms,
        read_mb: row.read_bytes as f64 / MIB,
        cache_hit_pct: row.cache_hit_pct,
        majflt: row.majflt,
        cpu_ms: row.cpu_ms,
        dense_resident_frac: row.dense_resident_frac,
        reset,
        delta_reasoning: delta_reasoning.to_owned(),
        delta_text: delta_text.to_owned(),
    })
    .to_string()
}

/// The session's `BMOE_DONE {...}` line of generation `id` with its `summary` (the spec's
/// keys, in its order): the same figures as the CSV's `# summary` trailer, with the context
/// length after the turn and the answer's split.
pub fn done_line(
    summary: &Summary,
    id: i64,
    cancelled: bool,
    n_past: usize,
    reasoning: &str,
    text: &str,
) -> String {
    let per = |x: f64| {
        if summary.tokens == 0 {
            0.0
        } else {
            x / summary.tokens as f64
        }
    };
    let s = |ns: u64| ns as f64 / 1e9;
    let d = &summary.decode;
    let p = &summary.prefill;
    let compute = d.compute_s(summary.decode_s, summary.overlap);
    let rate = |n: usize, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let sp = summary.spec_counts();
    Line::Done(bmoe_session::Done {
        id,
        cancelled,
        tokens: summary.tokens as u64,
        tok_s: rate(summary.tokens, summary.decode_s),
        prefill_s: summary.prefill_s,
        prefill_tps: rate(summary.n_prompt, summary.prefill_s),
        load_s: summary.load_s,
        cache_hit_pct: summary.cache_hit_pct,
        n_prompt: summary.n_prompt as u64,
        n_past: n_past as u64,
        compute_s_tok: per(compute),
        io_s_tok: per(s(d.io_ns)),
        cache_resident_mib: d.resident_bytes as f64 / MIB,
        cache_budget_mib: summary.cache_budget_mib,
        read_mib: d.read_bytes as f64 / MIB,
        stall_s_tok: per(s(d.stall_ns)),
        mgmt_s_tok: per(s(d.mgmt_ns)),
        majflt_tok: per(summary.usage.majflt as f64),
        cpu_s_tok: per(s(summary.usage.cpu_ns)),
        prefill_cpu_s: s(summary.prefill_usage.cpu_ns),
        prefill_read_mib: p.read_bytes as f64 / MIB,
        prefill_io_s: s(p.io_ns),
        prefill_stall_s: s(p.stall_ns),
        prefill_mgmt_s: s(p.mgmt_ns),
        prefill_dev_tokens: 0,
        prefill_dev_nodes: 0,
        prefill_dev_read_mib: 0.0,
        prefill_dev_stall_s: 0.0,
        token_demand_mib: per(d.demand_bytes as f64 / MIB),
        mtp_drafted: sp.drafted,
        mtp_accepted: sp.accepted,
        mtp_decodes: sp.decodes,
        mtp_draft_s_tok: per(sp.draft_s),
        drafted_steps: sp.drafted_steps,
        loop_overhead_s_tok: per(summary.loop_overhead_s),
        reasoning: reasoning.to_owned(),
        text: text.to_owned(),
    })
    .to_string()
}

/// The `ngram:` or `mtp:` lines of a generation of `tokens` tokens that took `decode_s`
/// seconds of passes: acceptance and tokens per verify decode, what drafting cost against the
/// rate, and (for `ngram`) the share of steps that drafted.
pub fn spec_lines(c: &SpecCounts, tokens: usize, decode_s: f64) -> Vec<String> {
    let name = c.source.name();
    let pct = store::cache::hit_pct(c.accepted, c.drafted);
    let per_decode = if c.decodes > 0 {
        tokens as f64 / c.decodes as f64
    } else {
        0.0
    };
    let rate = |s: f64| if s > 0.0 { tokens as f64 / s } else { 0.0 };
    let per_tok = if tokens > 0 {
        c.draft_s / tokens as f64
    } else {
        0.0
    };
    let mut v = vec![
        format!(
            "{name}: {}/{} drafts accepted ({pct:.1}%), {per_decode:.2} tokens per verify \
             decode ({} decodes for {tokens} tokens)",
            c.accepted, c.drafted, c.decodes
        ),
        format!(
            "{name}: drafting costs {per_tok:.4} s/token on top of decode \u{2192} {:.2} tok/s \
             effective (vs {:.2} reported)",
            rate(decode_s + c.draft_s),
            rate(decode_s)
        ),
    ];
    if c.source == Source::Ngram {
        v.push(format!(
            "ngram: drafted on {} of {} steps ({:.1}%); the rest decoded plainly",
            c.drafted_steps,
            c.decodes,
            store::cache::hit_pct(c.drafted_steps, c.decodes)
        ));
    }
    v
}

/// The `--predict-log` report of the figures `f`: the two `moe-predict:` lines and the per-layer table.
pub fn predict_lines(f: &AheadFigures) -> Vec<String> {
    let t = f.totals();
    let pct = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |p| format!("{p:.1}%"));
    let mut out = vec![
        format!(
            "moe-predict: stale-gate {} of routed slots ({} whole routings) | prev-token {} ({}) | fresh-gate control {} ({})",
            pct(t.stale.slot_pct()),
            pct(t.stale.whole_pct()),
            pct(t.prev.slot_pct()),
            pct(t.prev.whole_pct()),
            pct(t.control.slot_pct()),
            pct(t.control.whole_pct()),
        ),
        format!(
            "moe-predict: scored — stale-gate {} routings/{} slots, prev-token {}/{}, control {}/{}; {} routings the stale-gate could not rank",
            t.stale.rows,
            t.stale.slots,
            t.prev.rows,
            t.prev.slots,
            t.control.rows,
            t.control.slots,
            f.unranked
        ),
        format!(
            "  {:>5} {:>7} {:>7} {:>7} {:>10}",
            "layer", "stale", "prev", "ctrl", "routings"
        ),
    ];
    let cell = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |p| format!("{p:.1}"));
    for (l, s) in &f.layers {
        out.push(format!(
            "  {l:>5} {:>7} {:>7} {:>7} {:>10}",
            cell(s.stale.slot_pct()),
            cell(s.prev.slot_pct()),
            cell(s.control.slot_pct()),
            s.routings
        ));
    }
    if f.declined > 0 {
        out.push(format!(
            "moe-predict: {} routings wider than {MAX_SCORED} experts were not scored",
            f.declined
        ));
    }
    out
}

/// The `moe-route-ahead:` line of a run committing `n` layers early, from its figures `f`.
pub fn route_ahead_line(f: &AheadFigures, n: usize) -> String {
    format!(
        "moe-route-ahead: {n} layers early — {} routings committed, {} passed through; committed selection agreed with the router on {:.1}% of slots",
        f.committed,
        f.passed,
        f.agree_pct()
    )
}

#[cfg(test)]
mod tests {
    use runtime::predict::{LayerScores, Score};

    use super::*;

    #[test]
    fn generation_line_follows_the_spec_pattern() {
        assert_eq!(
            generation_line(16, Duration::from_millis(6208)),
            "generation: 16 tokens, 0.388 s/token (2.58 tok/s)"
        );
        assert_eq!(
            generation_line(0, Duration::ZERO),
            "generation: 0 tokens, 0.000 s/token (0.00 tok/s)"
        );
    }

    #[test]
    fn a_prefetch_line_only_when_something_was_read_ahead() {
        let none = StreamSnapshot::default();
        assert_eq!(prefetch_line(&none, &none, "couple"), None);
        let d = StreamSnapshot {
            prefetches: 3,
            prefetch_bytes: 3 << 20,
            prefetch_hits: 1,
            ..StreamSnapshot::default()
        };
        let p = StreamSnapshot {
            prefetches: 1,
            prefetch_bytes: 1 << 19,
            prefetch_hits: 1,
            ..StreamSnapshot::default()
        };
        assert_eq!(
            prefetch_line(&d, &p, "couple").as_deref(),
            Some("moe-prefetch: 3.5 MiB speculative, 2/4 experts useful (50.0%) [couple]")
        );
        assert_eq!(
            prefetch_line(&d, &p, "").as_deref(),
            Some("moe-prefetch: 3.5 MiB speculative, 2/4 experts useful (50.0%)")
        );
    }

    #[test]
    fn a_prompt_ahead_line_only_when_a_prompt_read_ahead_and_apart_from_the_prefetches() {
        let d = StreamSnapshot {
            prefetches: 3,
            prefetch_bytes: 3 << 20,
            prefetch_hits: 1,
            ..StreamSnapshot::default()
        };
        assert_eq!(prompt_ahead_line(&d, &StreamSnapshot::default()), None);
        let p = StreamSnapshot {
            prompt_ahead: 4,
            prompt_ahead_bytes: 5 << 19,
            prompt_ahead_hits: 3,
            ..StreamSnapshot::default()
        };
        assert_eq!(
            prompt_ahead_line(&d, &p).as_deref(),
            Some(
                "moe-prompt-ahead: 2.5 MiB read ahead for the next layer, 3/4 experts used (75.0%)"
            )
        );
    }

    #[test]
    fn the_compute_line_is_the_cpu_over_the_threads_per_token() {
        let usage = Usage {
            cpu_ns: 2_000_000_000,
            majflt: 4,
        };
        assert_eq!(
            compute_line(&usage, 1.0, 2, 2),
            "compute: 100.0% CPU occupancy (1.000 cpu-s/token over 2 threads), 2.00 major faults/token"
        );
    }

    #[test]
    fn the_stream_lines_split_the_decode_and_name_the_cache_only_with_one() {
        let d = StreamSnapshot {
            read_bytes: 2 << 20,
            io_ns: 1_000_000_000,
            stall_ns: 500_000_000,
            mgmt_ns: 250_000_000,
            lookups: 4,
            hits: 3,
            resident_bytes: 3 << 20,
            ..StreamSnapshot::default()
        };
        let decode = Duration::from_secs(4);
        assert_eq!(
            stream_summary(&d, 2, decode, true, true),
            [
                "moe-stream: read 2.0 MiB (1.0 MiB/token), decode 2.000 s/token (compute 1.625 + \
                 cache mgmt 0.125 + flash I/O 0.500 s/token, 2 MiB/s), stall_s/tok=0.250",
                "moe-cache: 75.0% hit, resident 3.0 MiB",
            ]
        );
        // Serial reads: the read time itself is waited, no stall figure, no cache line.
        assert_eq!(
            stream_summary(&d, 2, decode, false, false),
            [
                "moe-stream: read 2.0 MiB (1.0 MiB/token), decode 2.000 s/token (compute 1.375 + \
                 cache mgmt 0.125 + flash I/O 0.500 s/token, 2 MiB/s)"
            ]
        );
    }

    #[test]
    fn the_cache_aware_lines_only_for_the_policies_in_force() {
        let counts = engine::CacheAwareCounts {
            dropped: 5,
            reranked: 8,
            substituted: 2,
            ..engine::CacheAwareCounts::default()
        };
        assert!(cache_aware_lines(&engine::CacheAware::default(), &counts, 20).is_empty());
        let cfg = engine::CacheAware {
            drop_frac: 0.5,
            substitute: 0.25,
            ..engine::CacheAware::default()
        };
        assert_eq!(
            cache_aware_lines(&cfg, &counts, 20),
            [
                "moe-drop: 5/20 routed experts dropped (25.0%), threshold 0.5 x uniform",
                "moe-substitute: 2/8 routed experts moved to a resident expert (25.0%), lambda 0.25",
            ]
        );
    }

    #[test]
    fn a_token_s_load_line_only_when_it_read_and_its_progress_line_carries_the_text() {
        let mut row = TokenRow {
            step: 2,
            steps: 4,
            read_bytes: 1 << 20,
            io_ms: 30.0,
            ..TokenRow::default()
        };
        assert_eq!(
            load_line(&row).as_deref(),
            Some("BMOE_LOAD {\"mb\":1.000,\"ms\":30.000}")
        );
        let p = progress_line(&row, false, "", "a\"b\n");
        assert!(
            p.starts_with("BMOE_PROGRESS {\"step\":2,\"steps\":4,"),
            "{p}"
        );
        assert!(
            p.ends_with("\"delta_reasoning\":\"\",\"delta_text\":\"a\\\"b\\n\"}"),
            "{p}"
        );
        assert!(!p.contains("reset"), "{p}");
        assert!(
            progress_line(&row, true, "r", "").contains(",\"reset\":1,\"delta_reasoning\":\"r\",")
        );
        row.read_bytes = 0;
        assert_eq!(load_line(&row), None);
    }

    #[test]
    fn the_done_line_has_the_ids_the_figures_and_the_split_answer() {
        let s = Summary {
            tokens: 4,
            decode_s: 2.0,
            n_prompt: 3,
            ..Summary::default()
        };
        let l = done_line(&s, 7, true, 9, "why", "so\n");
        assert!(
            l.starts_with("BMOE_DONE {\"id\":7,\"cancelled\":true,\"tokens\":4,\"tok_s\":2.000,"),
            "{l}"
        );
        assert!(l.contains(",\"n_prompt\":3,\"n_past\":9,"), "{l}");
        assert!(
            l.ends_with(",\"reasoning\":\"why\",\"text\":\"so\\n\"}"),
            "{l}"
        );
    }

    #[test]
    fn the_lines_read_as_the_spec_writes_them() {
        let c = SpecCounts {
            source: Source::Ngram,
            drafted: 95,
            accepted: 42,
            decodes: 214,
            drafted_steps: 32,
            draft_s: 0.0,
        };
        let l = spec_lines(&c, 256, 256.0 / 5.24);
        assert_eq!(
            l[0],
            "ngram: 42/95 drafts accepted (44.2%), 1.20 tokens per verify decode \
             (214 decodes for 256 tokens)"
        );
        assert_eq!(
            l[1],
            "ngram: drafting costs 0.0000 s/token on top of decode \u{2192} 5.24 tok/s \
             effective (vs 5.24 reported)"
        );
        assert_eq!(
            l[2],
            "ngram: drafted on 32 of 214 steps (15.0%); the rest decoded plainly"
        );
        // the head's lines (as the reference prints them), no coverage line
        let l = spec_lines(
            &SpecCounts {
                source: Source::Mtp,
                drafted: 63,
                accepted: 41,
                decodes: 57,
                drafted_steps: 57,
                draft_s: 1.32,
            },
            132,
            132.0 / 8.0,
        );
        assert_eq!(
            l,
            [
                "mtp: 41/63 drafts accepted (65.1%), 2.32 tokens per verify decode \
                 (57 decodes for 132 tokens)",
                "mtp: drafting costs 0.0100 s/token on top of decode \u{2192} 7.41 tok/s \
                 effective (vs 8.00 reported)"
            ]
        );
    }

    #[test]
    fn the_predict_report_prints_a_dash_where_nothing_was_scored() {
        let score = |rows, slots, hit, whole| Score {
            rows,
            slots,
            hit,
            whole,
        };
        let mut f = AheadFigures {
            unranked: 2,
            ..AheadFigures::default()
        };
        f.layers.insert(
            0,
            LayerScores {
                stale: Score::default(),
                prev: score(1, 2, 2, 1),
                control: score(2, 4, 4, 2),
                routings: 2,
            },
        );
        f.layers.insert(
            1,
            LayerScores {
                stale: score(2, 4, 3, 1),
                prev: score(1, 2, 1, 0),
                control: score(2, 4, 4, 2),
                routings: 2,
            },
        );
        let lines = predict_lines(&f);
        assert_eq!(
            lines[0],
            "moe-predict: stale-gate 75.0% of routed slots (50.0% whole routings) | prev-token 75.0% (50.0%) | fresh-gate control 100.0% (100.0%)"
        );
        assert_eq!(
            lines[1],
            "moe-predict: scored — stale-gate 2 routings/4 slots, prev-token 2/4, control 4/8; 2 routings the stale-gate could not rank"
        );
        // layer 0: no stale-gate routings prints `-`, never 0.0
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["0", "-", "100.0", "100.0", "2"]
        );
        assert_eq!(
            lines[4].split_whitespace().collect::<Vec<_>>(),
            ["1", "75.0", "50.0", "100.0", "2"]
        );
        assert_eq!(lines.len(), 5);
        f.declined = 3;
        assert_eq!(
            predict_lines(&f)[5],
            format!("moe-predict: 3 routings wider than {MAX_SCORED} experts were not scored")
        );
    }

    #[test]
    fn the_route_ahead_line_says_what_was_committed_and_how_it_agreed() {
        let f = AheadFigures {
            committed: 1,
            passed: 1,
            committed_slots: 4,
            agreed_slots: 2,
            ..AheadFigures::default()
        };
        assert_eq!(
            route_ahead_line(&f, 1),
            "moe-route-ahead: 1 layers early — 1 routings committed, 1 passed through; committed selection agreed with the router on 50.0% of slots"
        );
    }
}
