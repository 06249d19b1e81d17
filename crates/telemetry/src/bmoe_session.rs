//! The `BMOE_*` protocol lines: the per-token `BMOE_LOAD` / `BMOE_PROGRESS` lines of
//! `--progress` and the control lines of `--session` (`BMOE_READY`, `BMOE_BEGIN`, `BMOE_DONE`,
//! `BMOE_DECIDE`, `BMOE_ERROR`), as BigMoeOnEdge's telemetry contract defines them
//! (docs/telemetry.md, docs/session.md).
//!
//! Each line is `BMOE_<TAG> {json}`: one typed record per tag, written with the spec's keys in
//! the spec's order and each float with the spec's number of decimals ([`Line`]'s `Display`),
//! and read back by [`Line::parse`]. A float that is not finite is written `null` and read back
//! as NaN (`choice_logp`'s `null`, minus infinity by the spec, reads back as minus infinity).
//! The parser ignores keys it does not know, so a reader keeps working when keys are added.

use std::fmt;

use crate::json::{Fields, JsonObject, json_exact};

/// A line that is not one of the protocol's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a BMOE line: {0}")]
pub struct LineError(pub String);

/// `BMOE_READY`: the model is loaded (once per session, first).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Ready {
    /// Seconds the load took.
    pub load_s: f64,
    /// The model's architecture.
    pub arch: String,
    /// The context length.
    pub n_ctx: u64,
    /// How a `"think":false` request can be honoured: `template`, `prefill` or `none`.
    pub think_ctl: String,
    /// The effective routing width (0 on a model without routed experts).
    pub n_expert_used: u64,
}

/// `BMOE_LOAD`: experts were read this token.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Load {
    /// MiB read from flash.
    pub mb: f64,
    /// The read time, in milliseconds.
    pub ms: f64,
}

/// `BMOE_PROGRESS`: one decoded token's figures and text deltas.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Progress {
    /// 1-based index of the token.
    pub step: u64,
    /// The target token count.
    pub steps: u64,
    pub wall_ms: f64,
    pub io_ms: f64,
    /// The residual compute time (clamped at 0).
    pub compute_ms: f64,
    pub mgmt_ms: f64,
    pub stall_ms: f64,
    /// MiB read from flash this token.
    pub read_mb: f64,
    /// Cumulative, or -1 without a cache.
    pub cache_hit_pct: f64,
    pub majflt: u64,
    pub cpu_ms: f64,
    /// The resident share of the dense weights, or -1 when unmeasured.
    pub dense_resident_frac: f64,
    /// The deltas replace the text so far instead of extending it (`"reset":1`).
    pub reset: bool,
    pub delta_reasoning: String,
    pub delta_text: String,
}

/// `BMOE_DONE`: a generation's summary (decode-phase figures unless named `prefill_`; `_tok`
/// keys are per-token averages).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Done {
    pub id: i64,
    pub cancelled: bool,
    pub tokens: u64,
    pub tok_s: f64,
    pub prefill_s: f64,
    pub prefill_tps: f64,
    pub load_s: f64,
    pub cache_hit_pct: f64,
    /// Tokens prefilled this turn.
    pub n_prompt: u64,
    /// The context length after the turn.
    pub n_past: u64,
    pub compute_s_tok: f64,
    pub io_s_tok: f64,
    pub cache_resident_mib: f64,
    pub cache_budget_mib: f64,
    pub read_mib: f64,
    pub stall_s_tok: f64,
    pub mgmt_s_tok: f64,
    pub majflt_tok: f64,
    pub cpu_s_tok: f64,
    pub prefill_cpu_s: f64,
    pub prefill_read_mib: f64,
    pub prefill_io_s: f64,
    pub prefill_stall_s: f64,
    pub prefill_mgmt_s: f64,
    pub prefill_dev_tokens: u64,
    pub prefill_dev_nodes: u64,
    pub prefill_dev_read_mib: f64,
    pub prefill_dev_stall_s: f64,
    pub token_demand_mib: f64,
    pub mtp_drafted: u64,
    pub mtp_accepted: u64,
    pub mtp_decodes: u64,
    pub mtp_draft_s_tok: f64,
    pub drafted_steps: u64,
    pub loop_overhead_s_tok: f64,
    /// The final thinking span.
    pub reasoning: String,
    /// The final answer.
    pub text: String,
}

/// `BMOE_DECIDE`: what a `decide` request found and what it cost.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decide {
    pub id: i64,
    pub cancelled: bool,
    /// The index of the best choice, -1 when cancelled.
    pub best: i64,
    /// Each choice's first-token log-probability, written exactly (minus infinity as `null`).
    pub choice_logp: Vec<f64>,
    pub n_tokens: u64,
    pub n_reused: u64,
    pub n_prefilled: u64,
    pub restore_s: f64,
    pub store_s: f64,
    pub prefill_s: f64,
    pub prefill_cpu_s: f64,
    pub prefill_read_mib: f64,
    pub prefill_io_s: f64,
    pub prefill_stall_s: f64,
    pub prefill_mgmt_s: f64,
    pub prefill_dev_tokens: u64,
    pub prefill_dev_read_mib: f64,
    pub prefill_dev_stall_s: f64,
    pub prefill_dev_routed: u64,
    pub prefill_dev_demand: u64,
    pub prefix_state_mib: f64,
}

/// `BMOE_ERROR`: a request refused (`fatal: false`, the session goes on) or the process ending.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Error {
    /// The request's id, -1 when none applies.
    pub id: i64,
    pub fatal: bool,
    pub msg: String,
}

/// One protocol line.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Ready(Ready),
    /// `BMOE_BEGIN`: request `id` was accepted and runs now.
    Begin {
        id: i64,
    },
    Load(Load),
    Progress(Progress),
    Done(Done),
    Decide(Decide),
    Error(Error),
}

impl Line {
    /// The line's tag (`BMOE_READY`, ...).
    pub fn tag(&self) -> &'static str {
        match self {
            Line::Ready(_) => "BMOE_READY",
            Line::Begin { .. } => "BMOE_BEGIN",
            Line::Load(_) => "BMOE_LOAD",
            Line::Progress(_) => "BMOE_PROGRESS",
            Line::Done(_) => "BMOE_DONE",
            Line::Decide(_) => "BMOE_DECIDE",
            Line::Error(_) => "BMOE_ERROR",
        }
    }

    /// The JSON object after the tag.
    fn json(&self) -> String {
        let mut o = JsonObject::default();
        match self {
            Line::Ready(r) => {
                o.float("load_s", r.load_s, 3)
                    .str("arch", &r.arch)
                    .uint("n_ctx", r.n_ctx)
                    .str("think_ctl", &r.think_ctl)
                    .uint("n_expert_used", r.n_expert_used);
            }
            Line::Begin { id } => {
                o.int("id", *id);
            }
            Line::Load(l) => {
                o.float("mb", l.mb, 3).float("ms", l.ms, 3);
            }
            Line::Progress(p) => {
                o.uint("step", p.step)
                    .uint("steps", p.steps)
                    .float("wall_ms", p.wall_ms, 3)
                    .float("io_ms", p.io_ms, 3)
                    .float("compute_ms", p.compute_ms, 3)
                    .float("mgmt_ms", p.mgmt_ms, 3)
                    .float("stall_ms", p.stall_ms, 3)
                    .float("read_mb", p.read_mb, 3)
                    .float("cache_hit_pct", p.cache_hit_pct, 2)
                    .uint("majflt", p.majflt)
                    .float("cpu_ms", p.cpu_ms, 3)
                    .float("dense_resident_frac", p.dense_resident_frac, 4);
                if p.reset {
                    o.uint("reset", 1);
                }
                o.str("delta_reasoning", &p.delta_reasoning)
                    .str("delta_text", &p.delta_text);
            }
            Line::Done(d) => {
                o.int("id", d.id)
                    .bool("cancelled", d.cancelled)
                    .uint("tokens", d.tokens)
                    .float("tok_s", d.tok_s, 3)
                    .float("prefill_s", d.prefill_s, 3)
                    .float("prefill_tps", d.prefill_tps, 3)
                    .float("load_s", d.load_s, 3)
                    .float("cache_hit_pct", d.cache_hit_pct, 2)
                    .uint("n_prompt", d.n_prompt)
                    .uint("n_past", d.n_past)
                    .float("compute_s_tok", d.compute_s_tok, 4)
                    .float("io_s_tok", d.io_s_tok, 4)
                    .float("cache_resident_mib", d.cache_resident_mib, 1)
                    .float("cache_budget_mib", d.cache_budget_mib, 1)
                    .float("read_mib", d.read_mib, 3)
                    .float("stall_s_tok", d.stall_s_tok, 4)
                    .float("mgmt_s_tok", d.mgmt_s_tok, 4)
                    .float("majflt_tok", d.majflt_tok, 3)
                    .float("cpu_s_tok", d.cpu_s_tok, 4)
                    .float("prefill_cpu_s", d.prefill_cpu_s, 3)
                    .float("prefill_read_mib", d.prefill_read_mib, 3)
                    .float("prefill_io_s", d.prefill_io_s, 3)
                    .float("prefill_stall_s", d.prefill_stall_s, 3)
                    .float("prefill_mgmt_s", d.prefill_mgmt_s, 3)
                    .uint("prefill_dev_tokens", d.prefill_dev_tokens)
                    .uint("prefill_dev_nodes", d.prefill_dev_nodes)
                    .float("prefill_dev_read_mib", d.prefill_dev_read_mib, 1)
                    .float("prefill_dev_stall_s", d.prefill_dev_stall_s, 1)
                    .float("token_demand_mib", d.token_demand_mib, 3)
                    .uint("mtp_drafted", d.mtp_drafted)
                    .uint("mtp_accepted", d.mtp_accepted)
                    .uint("mtp_decodes", d.mtp_decodes)
                    .float("mtp_draft_s_tok", d.mtp_draft_s_tok, 4)
                    .uint("drafted_steps", d.drafted_steps)
                    .float("loop_overhead_s_tok", d.loop_overhead_s_tok, 4)
                    .str("reasoning", &d.reasoning)
                    .str("text", &d.text);
            }
            Line::Decide(d) => {
                let logp: Vec<String> = d.choice_logp.iter().map(|&v| json_exact(v)).collect();
                o.int("id", d.id)
                    .bool("cancelled", d.cancelled)
                    .int("best", d.best)
                    .raw("choice_logp", &format!("[{}]", logp.join(",")))
                    .uint("n_tokens", d.n_tokens)
                    .uint("n_reused", d.n_reused)
                    .uint("n_prefilled", d.n_prefilled)
                    .float("restore_s", d.restore_s, 6)
                    .float("store_s", d.store_s, 6)
                    .float("prefill_s", d.prefill_s, 6)
                    .float("prefill_cpu_s", d.prefill_cpu_s, 3)
                    .float("prefill_read_mib", d.prefill_read_mib, 3)
                    .float("prefill_io_s", d.prefill_io_s, 3)
                    .float("prefill_stall_s", d.prefill_stall_s, 3)
                    .float("prefill_mgmt_s", d.prefill_mgmt_s, 3)
                    .uint("prefill_dev_tokens", d.prefill_dev_tokens)
                    .float("prefill_dev_read_mib", d.prefill_dev_read_mib, 1)
                    .float("prefill_dev_stall_s", d.prefill_dev_stall_s, 1)
                    .uint("prefill_dev_routed", d.prefill_dev_routed)
                    .uint("prefill_dev_demand", d.prefill_dev_demand)
                    .float("prefix_state_mib", d.prefix_state_mib, 3);
            }
            Line::Error(e) => {
                o.int("id", e.id).bool("fatal", e.fatal).str("msg", &e.msg);
            }
        }
        o.finish()
    }

    /// Reads one protocol line (without its line break).
    pub fn parse(line: &str) -> Result<Line, LineError> {
        let bad = |why: String| LineError(format!("{why}: {line}"));
        let (tag, json) = line
            .split_once(' ')
            .ok_or_else(|| bad("no JSON after the tag".to_owned()))?;
        let f = Fields::parse(json).map_err(bad)?;
        let parsed = match tag {
            "BMOE_READY" => Ready::read(&f).map(Line::Ready),
            "BMOE_BEGIN" => f.int("id").map(|id| Line::Begin { id }),
            "BMOE_LOAD" => Load::read(&f).map(Line::Load),
            "BMOE_PROGRESS" => Progress::read(&f).map(Line::Progress),
            "BMOE_DONE" => Done::read(&f).map(Line::Done),
            "BMOE_DECIDE" => Decide::read(&f).map(Line::Decide),
            "BMOE_ERROR" => Error::read(&f).map(Line::Error),
            other => Err(format!("unknown tag `{other}`")),
        };
        parsed.map_err(bad)
    }
}

/// `BMOE_<TAG> {json}`, without a line break.
impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.tag(), self.json())
    }
}

impl Ready {
    fn read(f: &Fields) -> Result<Ready, String> {
        Ok(Ready {
            load_s: f.float("load_s")?,
            arch: f.str("arch")?,
            n_ctx: f.uint("n_ctx")?,
            think_ctl: f.str("think_ctl")?,
            n_expert_used: f.uint("n_expert_used")?,
        })
    }
}

impl Load {
    fn read(f: &Fields) -> Result<Load, String> {
        Ok(Load {
            mb: f.float("mb")?,
            ms: f.float("ms")?,
        })
    }
}

impl Progress {
    fn read(f: &Fields) -> Result<Progress, String> {
        Ok(Progress {
            step: f.uint("step")?,
            steps: f.uint("steps")?,
            wall_ms: f.float("wall_ms")?,
            io_ms: f.float("io_ms")?,
            compute_ms: f.float("compute_ms")?,
            mgmt_ms: f.float("mgmt_ms")?,
            stall_ms: f.float("stall_ms")?,
            read_mb: f.float("read_mb")?,
            cache_hit_pct: f.float("cache_hit_pct")?,
            majflt: f.uint("majflt")?,
            cpu_ms: f.float("cpu_ms")?,
            dense_resident_frac: f.float("dense_resident_frac")?,
            reset: f.has("reset") && f.uint("reset")? == 1,
            delta_reasoning: f.str("delta_reasoning")?,
            delta_text: f.str("delta_text")?,
        })
    }
}

impl Done {
    fn read(f: &Fields) -> Result<Done, String> {
        Ok(Done {
            id: f.int("id")?,
            cancelled: f.bool("cancelled")?,
            tokens: f.uint("tokens")?,
            tok_s: f.float("tok_s")?,
            prefill_s: f.float("prefill_s")?,
            prefill_tps: f.float("prefill_tps")?,
            load_s: f.float("load_s")?,
            cache_hit_pct: f.float("cache_hit_pct")?,
            n_prompt: f.uint("n_prompt")?,
            n_past: f.uint("n_past")?,
            compute_s_tok: f.float("compute_s_tok")?,
            io_s_tok: f.float("io_s_tok")?,
            cache_resident_mib: f.float("cache_resident_mib")?,
            cache_budget_mib: f.float("cache_budget_mib")?,
            read_mib: f.float("read_mib")?,
            stall_s_tok: f.float("stall_s_tok")?,
            mgmt_s_tok: f.float("mgmt_s_tok")?,
            majflt_tok: f.float("majflt_tok")?,
            cpu_s_tok: f.float("cpu_s_tok")?,
            prefill_cpu_s: f.float("prefill_cpu_s")?,
            prefill_read_mib: f.float("prefill_read_mib")?,
            prefill_io_s: f.float("prefill_io_s")?,
            prefill_stall_s: f.float("prefill_stall_s")?,
            prefill_mgmt_s: f.float("prefill_mgmt_s")?,
            prefill_dev_tokens: f.uint("prefill_dev_tokens")?,
            prefill_dev_nodes: f.uint("prefill_dev_nodes")?,
            prefill_dev_read_mib: f.float("prefill_dev_read_mib")?,
            prefill_dev_stall_s: f.float("prefill_dev_stall_s")?,
            token_demand_mib: f.float("token_demand_mib")?,
            mtp_drafted: f.uint("mtp_drafted")?,
            mtp_accepted: f.uint("mtp_accepted")?,
            mtp_decodes: f.uint("mtp_decodes")?,
            mtp_draft_s_tok: f.float("mtp_draft_s_tok")?,
            drafted_steps: f.uint("drafted_steps")?,
            loop_overhead_s_tok: f.float("loop_overhead_s_tok")?,
            reasoning: f.str("reasoning")?,
            text: f.str("text")?,
        })
    }
}

impl Decide {
    fn read(f: &Fields) -> Result<Decide, String> {
        Ok(Decide {
            id: f.int("id")?,
            cancelled: f.bool("cancelled")?,
            best: f.int("best")?,
            choice_logp: f.floats("choice_logp", f64::NEG_INFINITY)?,
            n_tokens: f.uint("n_tokens")?,
            n_reused: f.uint("n_reused")?,
            n_prefilled: f.uint("n_prefilled")?,
            restore_s: f.float("restore_s")?,
            store_s: f.float("store_s")?,
            prefill_s: f.float("prefill_s")?,
            prefill_cpu_s: f.float("prefill_cpu_s")?,
            prefill_read_mib: f.float("prefill_read_mib")?,
            prefill_io_s: f.float("prefill_io_s")?,
            prefill_stall_s: f.float("prefill_stall_s")?,
            prefill_mgmt_s: f.float("prefill_mgmt_s")?,
            prefill_dev_tokens: f.uint("prefill_dev_tokens")?,
            prefill_dev_read_mib: f.float("prefill_dev_read_mib")?,
            prefill_dev_stall_s: f.float("prefill_dev_stall_s")?,
            prefill_dev_routed: f.uint("prefill_dev_routed")?,
            prefill_dev_demand: f.uint("prefill_dev_demand")?,
            prefix_state_mib: f.float("prefix_state_mib")?,
        })
    }
}

impl Error {
    fn read(f: &Fields) -> Result<Error, String> {
        Ok(Error {
            id: f.int("id")?,
            fatal: f.bool("fatal")?,
            msg: f.str("msg")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A float the line writes exactly: `k / 10^decimals`.
    fn fixed(decimals: u32) -> impl Strategy<Value = f64> {
        (-10_000_000i64..10_000_000).prop_map(move |k| k as f64 / 10f64.powi(decimals as i32))
    }

    fn text() -> impl Strategy<Value = String> {
        "(?s)[ -~\n\t\"\\\\é😀]{0,24}"
    }

    fn progress() -> impl Strategy<Value = Progress> {
        (
            (0u64..1 << 40, 0u64..1 << 40, 0u64..1 << 40),
            prop::array::uniform8(fixed(3)),
            (fixed(2), fixed(4), any::<bool>(), text(), text()),
        )
            .prop_map(
                |((step, steps, majflt), f, (hit, frac, reset, r, t))| Progress {
                    step,
                    steps,
                    wall_ms: f[0],
                    io_ms: f[1],
                    compute_ms: f[2],
                    mgmt_ms: f[3],
                    stall_ms: f[4],
                    read_mb: f[5],
                    cache_hit_pct: hit,
                    majflt,
                    cpu_ms: f[6],
                    dense_resident_frac: frac,
                    reset,
                    delta_reasoning: r,
                    delta_text: t,
                },
            )
    }

    fn done() -> impl Strategy<Value = Done> {
        (
            (
                any::<i64>(),
                any::<bool>(),
                prop::array::uniform8(0u64..1 << 50),
            ),
            prop::array::uniform16(fixed(3)),
            prop::array::uniform8(fixed(4)),
            (fixed(2), fixed(1), fixed(1), fixed(1), fixed(1)),
            (text(), text()),
        )
            .prop_map(
                |((id, cancelled, n), f3, f4, (hit, a, b, c, d), (r, t))| Done {
                    id,
                    cancelled,
                    tokens: n[0],
                    tok_s: f3[0],
                    prefill_s: f3[1],
                    prefill_tps: f3[2],
                    load_s: f3[3],
                    cache_hit_pct: hit,
                    n_prompt: n[1],
                    n_past: n[2],
                    compute_s_tok: f4[0],
                    io_s_tok: f4[1],
                    cache_resident_mib: a,
                    cache_budget_mib: b,
                    read_mib: f3[4],
                    stall_s_tok: f4[2],
                    mgmt_s_tok: f4[3],
                    majflt_tok: f3[5],
                    cpu_s_tok: f4[4],
                    prefill_cpu_s: f3[6],
                    prefill_read_mib: f3[7],
                    prefill_io_s: f3[8],
                    prefill_stall_s: f3[9],
                    prefill_mgmt_s: f3[10],
                    prefill_dev_tokens: n[3],
                    prefill_dev_nodes: n[4],
                    prefill_dev_read_mib: c,
                    prefill_dev_stall_s: d,
                    token_demand_mib: f3[11],
                    mtp_drafted: n[5],
                    mtp_accepted: n[6],
                    mtp_decodes: n[7],
                    mtp_draft_s_tok: f4[5],
                    drafted_steps: n[0] / 2,
                    loop_overhead_s_tok: f4[6],
                    reasoning: r,
                    text: t,
                },
            )
    }

    fn decide() -> impl Strategy<Value = Decide> {
        let logp = prop_oneof![
            any::<f64>().prop_filter("finite", |v| v.is_finite()),
            Just(f64::NEG_INFINITY)
        ];
        (
            (any::<i64>(), any::<bool>(), -1i64..64),
            prop::collection::vec(logp, 0..6),
            prop::array::uniform8(0u64..1 << 50),
            prop::array::uniform3(fixed(6)),
            prop::array::uniform6(fixed(3)),
            (fixed(1), fixed(1)),
        )
            .prop_map(|((id, cancelled, best), logp, n, f6, f3, (a, b))| Decide {
                id,
                cancelled,
                best,
                choice_logp: logp,
                n_tokens: n[0],
                n_reused: n[1],
                n_prefilled: n[2],
                restore_s: f6[0],
                store_s: f6[1],
                prefill_s: f6[2],
                prefill_cpu_s: f3[0],
                prefill_read_mib: f3[1],
                prefill_io_s: f3[2],
                prefill_stall_s: f3[3],
                prefill_mgmt_s: f3[4],
                prefill_dev_tokens: n[3],
                prefill_dev_read_mib: a,
                prefill_dev_stall_s: b,
                prefill_dev_routed: n[4],
                prefill_dev_demand: n[5],
                prefix_state_mib: f3[5],
            })
    }

    fn line() -> impl Strategy<Value = Line> {
        prop_oneof![
            (
                fixed(3),
                "[a-z0-9_]{0,12}",
                0u64..1 << 40,
                "template|prefill|none",
                0u64..64
            )
                .prop_map(|(load_s, arch, n_ctx, think_ctl, n_expert_used)| {
                    Line::Ready(Ready {
                        load_s,
                        arch,
                        n_ctx,
                        think_ctl,
                        n_expert_used,
                    })
                }),
            any::<i64>().prop_map(|id| Line::Begin { id }),
            (fixed(3), fixed(3)).prop_map(|(mb, ms)| Line::Load(Load { mb, ms })),
            progress().prop_map(Line::Progress),
            done().prop_map(Line::Done),
            decide().prop_map(Line::Decide),
            (any::<i64>(), any::<bool>(), text()).prop_map(|(id, fatal, msg)| Line::Error(Error {
                id,
                fatal,
                msg
            })),
        ]
    }

    proptest! {
        #[test]
        fn every_line_reads_back_as_written(l in line()) {
            let text = l.to_string();
            prop_assert!(!text.contains('\n'), "{}", text);
            let mut back = Line::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            if let (Line::Decide(b), Line::Decide(w)) = (&mut back, &l) {
                // `choice_logp` is written exactly, but read within serde_json's precision
                // (its default float parser can miss by an ulp at 17 digits).
                prop_assert_eq!(b.choice_logp.len(), w.choice_logp.len());
                for (x, y) in b.choice_logp.iter().zip(&w.choice_logp) {
                    prop_assert!(x == y || (x - y).abs() <= 2.0 * f64::EPSILON * y.abs(), "{} {}", x, y);
                }
                b.choice_logp.clone_from(&w.choice_logp);
            } else {
                prop_assert_eq!(back.to_string(), text);
            }
            prop_assert_eq!(&back, &l);
        }

        #[test]
        fn any_figures_write_the_same_line_after_a_read(
            f in prop::array::uniform8(-1e9f64..1e9), hit in -1f64..100.0,
        ) {
            // Figures are rounded as they are written: reading the line back and writing it
            // again changes nothing.
            let l = Line::Progress(Progress {
                step: 3,
                steps: 9,
                wall_ms: f[0],
                io_ms: f[1],
                compute_ms: f[2],
                mgmt_ms: f[3],
                stall_ms: f[4],
                read_mb: f[5],
                cache_hit_pct: hit,
                majflt: 2,
                cpu_ms: f[6],
                dense_resident_frac: f[7],
                ..Progress::default()
            });
            let text = l.to_string();
            let back = Line::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(back.to_string(), text);
        }
    }

    #[test]
    fn lines_are_written_as_the_spec_shows_them() {
        assert_eq!(
            Line::Load(Load { mb: 1.0, ms: 30.0 }).to_string(),
            r#"BMOE_LOAD {"mb":1.000,"ms":30.000}"#
        );
        assert_eq!(Line::Begin { id: 7 }.to_string(), r#"BMOE_BEGIN {"id":7}"#);
        let p = Line::Progress(Progress {
            step: 1,
            steps: 4,
            cache_hit_pct: -1.0,
            dense_resident_frac: -1.0,
            reset: true,
            delta_text: "a\"b\n".into(),
            ..Progress::default()
        });
        assert_eq!(
            p.to_string(),
            "BMOE_PROGRESS {\"step\":1,\"steps\":4,\"wall_ms\":0.000,\"io_ms\":0.000,\
             \"compute_ms\":0.000,\"mgmt_ms\":0.000,\"stall_ms\":0.000,\"read_mb\":0.000,\
             \"cache_hit_pct\":-1.00,\"majflt\":0,\"cpu_ms\":0.000,\"dense_resident_frac\":-1.0000,\
             \"reset\":1,\"delta_reasoning\":\"\",\"delta_text\":\"a\\\"b\\n\"}"
        );
        let d = Line::Decide(Decide {
            id: 2,
            best: 1,
            choice_logp: vec![-0.5, f64::NEG_INFINITY],
            ..Decide::default()
        });
        assert!(
            d.to_string().starts_with(
                r#"BMOE_DECIDE {"id":2,"cancelled":false,"best":1,"choice_logp":[-0.5,null],"#
            ),
            "{d}"
        );
    }

    #[test]
    fn foreign_lines_are_refused_with_the_reason() {
        let err = |l: &str| Line::parse(l).unwrap_err().0;
        assert_eq!(err("BMOE_BEGIN"), "no JSON after the tag: BMOE_BEGIN");
        assert_eq!(err("BMOE_NOPE {}"), "unknown tag `BMOE_NOPE`: BMOE_NOPE {}");
        assert_eq!(err("BMOE_BEGIN {}"), "no `id`: BMOE_BEGIN {}");
        assert!(err("BMOE_LOAD {\"mb\":1").starts_with("not valid JSON"));
        // Keys a reader does not know are skipped.
        assert_eq!(
            Line::parse(r#"BMOE_BEGIN {"id":3,"later":true}"#),
            Ok(Line::Begin { id: 3 })
        );
    }
}
