//! Run telemetry as BigMoeOnEdge's telemetry contract defines it (docs/telemetry.md): one sample per decoded token (time,
//! reads, cache, faults, CPU, memory), the `BMOE_LOAD` / `BMOE_PROGRESS` lines of `--progress`,
//! and the `--csv` sink (`# bmoe_metrics v2` preamble, the per-token rows, the `# summary`
//! trailer). The formats themselves live in `telemetry` (`bmoe_metrics`, `bmoe_session`): the
//! types here turn into their records (`TokenRow::metrics`, `Preamble::record`) and are written
//! through them.
//!
//! Where the spec speaks of `llama_decode`, sluice's decode call (`Engine::forward` of one
//! token) is meant: `wall_ms` brackets it and nothing else.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use telemetry::bmoe_metrics::{self, MetricsRow, MetricsWriter};

use crate::error::{Context, Result};
use crate::events::{Summary, TokenRow};
use crate::facts::Preamble;
use crate::probes::MemPicture;

const MIB: f64 = (1u64 << 20) as f64;

impl TokenRow {
    /// The row as the `bmoe_metrics` CSV writes it (its memory in MiB).
    pub fn metrics(&self) -> MetricsRow {
        let mib = |b: u64| b as f64 / MIB;
        let m = &self.mem;
        MetricsRow {
            step: self.step as u64,
            steps: self.steps as u64,
            wall_ms: self.wall_ms,
            io_ms: self.io_ms,
            compute_ms: self.compute_ms,
            read_bytes: self.read_bytes,
            cache_hit_pct: self.cache_hit_pct,
            stall_ms: self.stall_ms,
            mgmt_ms: self.mgmt_ms,
            majflt: self.majflt,
            cpu_ms: self.cpu_ms,
            dense_resident_frac: self.dense_resident_frac,
            turn: u64::from(self.turn),
            cache_budget_mib: self.cache_budget_mib,
            rss_mib: mib(m.rss),
            rss_anon_mib: mib(m.rss_anon),
            rss_file_mib: mib(m.rss_file),
            swap_mib: mib(m.swap),
            mem_available_mib: mib(m.mem_available),
            mem_free_mib: mib(m.mem_free),
            swap_free_mib: mib(m.swap_free),
            loop_overhead_ms: self.loop_overhead_ms,
            mtp_batch: self.mtp_batch as u64,
            mtp_draft_ms: self.mtp_draft_ms,
        }
    }
}

impl Summary {
    /// The `# summary ...` line.
    pub fn line(&self) -> String {
        bmoe_metrics::summary_line(&self.fields())
    }

    /// The `key=value` pairs of the `# summary` trailer, in the spec's order, as written.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let n = self.tokens.max(1) as f64;
        let per = |x: f64| if self.tokens == 0 { 0.0 } else { x / n };
        let s = |ns: u64| ns as f64 / 1e9;
        let d = &self.decode;
        let compute = d.compute_s(self.decode_s, self.overlap);
        let rate = if self.decode_s > 0.0 {
            self.tokens as f64 / self.decode_s
        } else {
            0.0
        };
        let p = &self.prefill;
        let sp = self.spec_counts();
        vec![
            ("tokens", self.tokens.to_string()),
            ("tok/s", format!("{rate:.3}")),
            ("s/tok", format!("{:.4}", per(self.decode_s))),
            ("load_s", format!("{:.3}", self.load_s)),
            ("n_prompt", self.n_prompt.to_string()),
            ("prefill_s", format!("{:.3}", self.prefill_s)),
            (
                "prefill_tps",
                format!(
                    "{:.3}",
                    if self.prefill_s > 0.0 {
                        self.n_prompt as f64 / self.prefill_s
                    } else {
                        0.0
                    }
                ),
            ),
            ("cache_hit_pct", format!("{:.2}", self.cache_hit_pct)),
            ("cache_budget_MiB", format!("{:.1}", self.cache_budget_mib)),
            // budget changes during the run: sluice sizes its cache once, before the first token
            ("cache_resizes", "0".into()),
            (
                "cache_resident_MiB",
                format!("{:.1}", d.resident_bytes as f64 / MIB),
            ),
            ("read_MiB", format!("{:.3}", d.read_bytes as f64 / MIB)),
            // the generation's expert read time in all (`io_s/tok` is its share per token)
            ("io_s", format!("{:.3}", s(d.io_ns))),
            ("io_s/tok", format!("{:.4}", per(s(d.io_ns)))),
            ("compute_s/tok", format!("{:.4}", per(compute))),
            ("stall_s/tok", format!("{:.4}", per(s(d.stall_ns)))),
            ("mgmt_s/tok", format!("{:.4}", per(s(d.mgmt_ns)))),
            (
                "majflt/tok",
                format!("{:.3}", per(self.usage.majflt as f64)),
            ),
            ("cpu_s/tok", format!("{:.4}", per(s(self.usage.cpu_ns)))),
            (
                "token_demand_MiB",
                format!("{:.3}", per(d.demand_bytes as f64 / MIB)),
            ),
            ("experts_routed", self.experts_routed.to_string()),
            ("experts_dropped", self.cache_aware.dropped.to_string()),
            ("experts_reranked", self.cache_aware.reranked.to_string()),
            (
                "experts_substituted",
                self.cache_aware.substituted.to_string(),
            ),
            ("row_table_MiB", "0".into()),
            ("row_resident_MiB", "0".into()),
            ("row_rows", "0".into()),
            ("row_reads", "0".into()),
            ("row_read_MiB", "0".into()),
            ("row_evictions", "0".into()),
            ("row_io_errors", "0".into()),
            (
                "layer_demand_MiB",
                format!("{:.3}", d.layer_demand_max as f64 / MIB),
            ),
            (
                "loop_overhead_s/tok",
                format!("{:.4}", per(self.loop_overhead_s)),
            ),
            ("drain_s/tok", "0".into()),
            ("adopt_s/tok", "0".into()),
            ("evictions", d.evictions.to_string()),
            ("rereads", d.rereads.to_string()),
            (
                "spec_read_MiB",
                format!("{:.3}", d.prefetch_bytes as f64 / MIB),
            ),
            ("spec_experts", d.prefetches.to_string()),
            ("spec_useful", d.prefetch_hits.to_string()),
            // speculative decoding (`--ngram`; zeros without it)
            ("mtp_drafted", sp.drafted.to_string()),
            ("mtp_accepted", sp.accepted.to_string()),
            ("mtp_decodes", sp.decodes.to_string()),
            ("mtp_draft_s/tok", format!("{:.4}", per(sp.draft_s))),
            ("drafted_steps", sp.drafted_steps.to_string()),
            ("ra_committed", self.ahead.committed.to_string()),
            ("ra_passthrough", self.ahead.passed.to_string()),
            ("ra_agree_pct", format!("{:.2}", self.ahead.agree_pct())),
            (
                "ra_gemv_ms/tok",
                format!("{:.4}", per(self.ahead.rank_ns as f64 / 1e6)),
            ),
            ("ra_issue_ms/tok", "0".into()),
            ("ra_wd_ms/tok", "0".into()),
            (
                "prefill_cpu_s",
                format!("{:.3}", s(self.prefill_usage.cpu_ns)),
            ),
            (
                "prefill_read_mib",
                format!("{:.3}", p.read_bytes as f64 / MIB),
            ),
            ("prefill_io_s", format!("{:.3}", s(p.io_ns))),
            ("prefill_stall_s", format!("{:.3}", s(p.stall_ns))),
            ("prefill_mgmt_s", format!("{:.3}", s(p.mgmt_ns))),
            ("prefill_dev_tokens", "0".into()),
            ("prefill_dev_nodes", "0".into()),
            ("prefill_dev_read_mib", "0".into()),
            ("prefill_dev_stall_s", "0".into()),
        ]
    }
}

/// The `--csv` file: preamble once, a row per token, a summary after each generation (one
/// for a one-shot run, one per turn of a session), written by [`bmoe_metrics::MetricsWriter`].
pub struct CsvSink {
    path: PathBuf,
    w: MetricsWriter<BufWriter<File>>,
}

impl CsvSink {
    pub fn create(path: &Path, preamble: &Preamble) -> Result<CsvSink> {
        let f = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let w = MetricsWriter::new(BufWriter::new(f), &preamble.record())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(CsvSink {
            path: path.to_owned(),
            w,
        })
    }

    pub fn row(&mut self, r: &TokenRow) -> Result<()> {
        self.w
            .row(&r.metrics())
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// The `# summary` line of a generation (a session writes one per turn), flushed.
    pub fn summary(&mut self, summary: &Summary) -> Result<()> {
        self.w
            .summary(&summary.fields())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// The CSV as a generation's sink: a row per token (with the memory picture at that moment),
/// the summary when the generation ends.
impl crate::sink::Sink for CsvSink {
    fn delta(&mut self, _d: &chat::SplitDelta) -> Result<()> {
        Ok(())
    }

    fn token(&mut self, row: &TokenRow) -> Result<()> {
        let mut row = row.clone();
        row.mem = MemPicture::now();
        self.row(&row)
    }

    fn finished(&mut self, o: &crate::events::Outcome) -> Result<()> {
        self.summary(&o.summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_has_every_column() {
        let r = TokenRow::default();
        assert_eq!(
            r.metrics().to_string().split(',').count(),
            bmoe_metrics::CSV_COLUMNS.split(',').count()
        );
    }
}
