//! What a generation reports, as plain data: the prompt [`Prefilled`], each token's figures
//! ([`TokenRow`]), the generation's totals ([`Summary`]) and how it went ([`Outcome`], with
//! why it [`End`]ed). A [`Sink`](crate::sink::Sink) receives them as they happen; nothing here
//! renders them as text — the front ends do (the `sluice` binary its summary lines and
//! `BMOE_*` lines, a server its JSON), and the `bmoe_metrics` CSV writes its rows and trailer
//! ([`crate::telemetry::CsvSink`]). What is computed here are numbers (the compute residual of
//! a wall time).

use std::time::Duration;

use crate::probes::{MemPicture, Usage};
use crate::source::StreamSnapshot;
use crate::spec::SpecCounts;

/// The prompt is in the context.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prefilled {
    /// The prompt's tokens.
    pub n_prompt: usize,
    /// How many of them were run (the others were already in the context).
    pub n_new: usize,
    /// Wall time of the prefill.
    pub secs: f64,
}

/// One decoded token's figures.
#[derive(Clone, Debug, Default)]
pub struct TokenRow {
    /// The token's place in the generation, 1-based.
    pub step: usize,
    /// The generation's token limit.
    pub steps: usize,
    /// Wall time of the token's forward pass.
    pub wall_ms: f64,
    /// Time the expert reads of the pass took.
    pub io_ms: f64,
    /// What the wait for reads and the cache management leave of the wall time
    /// ([`compute_residual`]).
    pub compute_ms: f64,
    /// Expert bytes read for the pass.
    pub read_bytes: u64,
    /// Cumulative, or -1 without a cache.
    pub cache_hit_pct: f64,
    /// Time the pass waited for reads that overlap compute.
    pub stall_ms: f64,
    /// Time the expert cache's management took.
    pub mgmt_ms: f64,
    /// The process's major faults during the pass.
    pub majflt: u64,
    /// The process's CPU time during the pass.
    pub cpu_ms: f64,
    /// The share of the dense weights in RAM (0 to 1), or -1 when not measured.
    pub dense_resident_frac: f64,
    /// The session turn (0 for a one-shot run).
    pub turn: u32,
    /// The expert cache's budget.
    pub cache_budget_mib: f64,
    /// The memory picture (zeros until a sink that wants it takes it).
    pub mem: MemPicture,
    /// Time between this pass and the previous one (sampling, text, sinks).
    pub loop_overhead_ms: f64,
    /// Tokens the pass this row's cost is of confirmed (speculation: a verify pass's whole
    /// cost is on its group's first row, which says how many tokens it confirmed; the others
    /// carry zeros, this one too). 1 without speculation.
    pub mtp_batch: usize,
    /// What drafting before this row's pass and cutting its rejected drafts out of the
    /// context after it took (outside the passes, in the loop's overhead).
    pub mtp_draft_ms: f64,
}

impl TokenRow {
    /// A row from the decode's wall time, the streamer's and the process's deltas over it.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        step: usize,
        steps: usize,
        wall_s: f64,
        d: &StreamSnapshot,
        overlap: bool,
        usage: &Usage,
        hit_pct: f64,
        loop_overhead_s: f64,
    ) -> TokenRow {
        let ms = |ns: u64| ns as f64 / 1e6;
        let wall_ms = wall_s * 1e3;
        let (io_ms, stall_ms, mgmt_ms) = (ms(d.io_ns), ms(d.stall_ns), ms(d.mgmt_ns));
        TokenRow {
            step,
            steps,
            wall_ms,
            io_ms,
            compute_ms: compute_residual(wall_ms, io_ms, stall_ms, mgmt_ms, overlap),
            read_bytes: d.read_bytes,
            cache_hit_pct: hit_pct,
            stall_ms,
            mgmt_ms,
            majflt: usage.majflt,
            cpu_ms: ms(usage.cpu_ns),
            dense_resident_frac: -1.0,
            turn: 0,
            cache_budget_mib: 0.0,
            mem: MemPicture::default(),
            loop_overhead_ms: loop_overhead_s * 1e3,
            mtp_batch: 1,
            mtp_draft_ms: 0.0,
        }
    }
}

/// The compute share of a wall time (any one unit for all four): what is left after the wait
/// for reads — the read time itself when serial, the stall when the reads overlap compute —
/// and the cache management; never negative.
pub fn compute_residual(wall: f64, io: f64, stall: f64, mgmt: f64, overlap: bool) -> f64 {
    let waited = if overlap { stall } else { io };
    (wall - waited - mgmt).max(0.0)
}

impl StreamSnapshot {
    /// [`compute_residual`] of `wall_s` seconds with these counters.
    pub fn compute_s(&self, wall_s: f64, overlap: bool) -> f64 {
        let s = |ns: u64| ns as f64 / 1e9;
        compute_residual(
            wall_s,
            s(self.io_ns),
            s(self.stall_ns),
            s(self.mgmt_ns),
            overlap,
        )
    }
}

/// The figures of the `# summary` trailer (decode-phase totals unless named `prefill_`).
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Tokens generated.
    pub tokens: usize,
    /// Wall time of the decode passes.
    pub decode_s: f64,
    /// Seconds the model's load took.
    pub load_s: f64,
    /// Prompt tokens run by the prefill (those already in the context not counted).
    pub n_prompt: usize,
    /// Wall time of the prefill.
    pub prefill_s: f64,
    /// The expert source's counters over the decode.
    pub decode: StreamSnapshot,
    /// The reads overlap compute (`--overlap`): the stall, not the read time, is waited.
    pub overlap: bool,
    /// The process's CPU time and major faults over the decode.
    pub usage: Usage,
    /// Cumulative hit rate, or -1 without a cache.
    pub cache_hit_pct: f64,
    /// The expert cache's budget.
    pub cache_budget_mib: f64,
    /// Routed expert slots of the decode, those cache-aware dropping skipped included.
    pub experts_routed: u64,
    /// What the cache-aware policies did during the decode.
    pub cache_aware: engine::CacheAwareCounts,
    /// Time spent between the decode passes.
    pub loop_overhead_s: f64,
    /// The expert source's counters over the prefill.
    pub prefill: StreamSnapshot,
    /// The process's CPU time and major faults over the prefill.
    pub prefill_usage: Usage,
    /// What was ranked ahead of the router during the generation (`--predict-log`,
    /// `--route-ahead`).
    pub ahead: crate::predict::AheadFigures,
    /// What speculative decoding did (`--ngram`; `None` without it).
    pub spec: Option<SpecCounts>,
}

impl Summary {
    /// Speculation's counters (zeros without it, as the spec writes them).
    pub fn spec_counts(&self) -> SpecCounts {
        self.spec.unwrap_or_default()
    }
}

/// What a generation did.
#[derive(Debug)]
pub struct Outcome {
    /// The generation's totals (what the CSV's `# summary` trailer and `BMOE_DONE` carry).
    pub summary: Summary,
    /// Wall time of the decode passes.
    pub decode: Duration,
    /// The process's CPU time and major faults over the decode.
    pub decode_usage: Usage,
    /// The expert source's counters over the decode.
    pub d: StreamSnapshot,
    /// The answer's text.
    pub answer: String,
    /// The reasoning's text (of a chat prompt of a reasoning model; empty otherwise).
    pub reasoning: String,
    /// Stopped by a cancel request (the context then holds part of the turn).
    pub cancelled: bool,
    /// The generated tokens run into the context, in order.
    pub tokens: Vec<u32>,
    /// Why the generation ended.
    pub end: End,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The model drew an end-of-generation token.
    Eog,
    /// The sink asked to stop (a stop sequence appeared).
    Stop,
    /// The turn's token limit.
    Length,
    /// The context is full.
    Context,
    /// A cancel request.
    Cancelled,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_is_what_the_wait_and_the_management_leave() {
        // Serial: the reads' own time is waited; overlapped: only the stall.
        assert_eq!(compute_residual(10.0, 3.0, 1.0, 2.0, false), 5.0);
        assert_eq!(compute_residual(10.0, 3.0, 1.0, 2.0, true), 7.0);
        assert_eq!(compute_residual(1.0, 3.0, 1.0, 2.0, false), 0.0);
        let d = StreamSnapshot {
            io_ns: 2_000_000_000,
            stall_ns: 500_000_000,
            mgmt_ns: 250_000_000,
            ..StreamSnapshot::default()
        };
        assert_eq!(d.compute_s(4.0, false), 1.75);
        assert_eq!(d.compute_s(4.0, true), 3.25);
    }

    #[test]
    fn a_row_takes_the_deltas_in_milliseconds_and_clamps_the_residual() {
        let d = StreamSnapshot {
            io_ns: 30_000_000,
            mgmt_ns: 5_000_000,
            read_bytes: 1 << 20,
            ..StreamSnapshot::default()
        };
        let usage = Usage {
            cpu_ns: 2_500_000,
            majflt: 3,
        };
        let r = TokenRow::new(1, 4, 0.020, &d, false, &usage, 50.0, 0.001);
        // 20 ms of wall against 35 ms measured: the residual is clamped at 0.
        assert_eq!(r.compute_ms, 0.0);
        assert_eq!(
            (r.step, r.steps, r.read_bytes, r.majflt),
            (1, 4, 1 << 20, 3)
        );
        assert_eq!(
            (r.wall_ms, r.io_ms, r.mgmt_ms, r.cpu_ms),
            (20.0, 30.0, 5.0, 2.5)
        );
        assert_eq!((r.cache_hit_pct, r.loop_overhead_ms), (50.0, 1.0));
        // Overlapped, only the stall (none here) and the management are taken from the wall.
        let r = TokenRow::new(1, 4, 0.020, &d, true, &usage, 50.0, 0.0);
        assert_eq!(r.compute_ms, 15.0);
        // Nothing is known of the memory or the dense weights until a sink looks.
        assert_eq!((r.dense_resident_frac, r.mtp_batch), (-1.0, 1));
    }

    #[test]
    fn a_summary_counts_its_speculation_and_zeros_without_it() {
        let mut s = Summary::default();
        assert_eq!(s.spec_counts(), SpecCounts::default());
        let c = SpecCounts {
            drafted: 5,
            accepted: 3,
            decodes: 4,
            ..SpecCounts::default()
        };
        s.spec = Some(c);
        assert_eq!(s.spec_counts(), c);
    }
}
