//! `sluice run --ppl FILE`: the perplexity and next-token hit rate of a text under the model
//! (`runtime::score`), printed with the run's mode and, when the experts stream, the stream
//! summary. `--ppl-step` runs one token per forward pass, as decode does.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

use runtime::generate::Runtime;

/// Scores the text of `path` (one token per pass when `step`); each position's most likely
/// next token goes to `predictions` when given.
pub fn run(
    rt: &mut Runtime<'_>,
    path: &Path,
    step: bool,
    predictions: Option<&Path>,
) -> Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--ppl: cannot read {}", path.display()))?;
    let s = runtime::score::score_text(rt, &text, step)
        .with_context(|| format!("--ppl: {}", path.display()))?;
    let score = &s.score;
    let mut w = std::io::stdout().lock();
    writeln!(
        w,
        "perplexity: {:.4} over {} tokens ({:.4} nats/token), next-token hit {:.1}% ({}, {:.3} s)",
        score.perplexity(),
        score.n,
        score.nats_per_token(),
        score.hit_pct(),
        if step {
            "one token per forward pass"
        } else {
            "one prefill"
        },
        s.wall.as_secs_f64()
    )?;
    writeln!(w, "{}", rt.mode)?;
    if rt.streaming {
        for line in crate::lines::stream_summary(
            &s.counters,
            score.n,
            s.wall,
            rt.overlap,
            rt.cache_bytes > 0,
        ) {
            writeln!(w, "{line}")?;
        }
    }
    for line in crate::lines::cache_aware_lines(
        &rt.engine.cache_aware(),
        &s.cache_aware,
        s.counters.routed + s.cache_aware.dropped,
    ) {
        writeln!(w, "{line}")?;
    }
    w.flush()?;
    if let Some(out) = predictions {
        write_predictions(out, &s.predicted)?;
    }
    Ok(())
}

/// One token id per line: each scored position's most likely next token.
fn write_predictions(path: &Path, ids: &[u32]) -> Result<()> {
    let mut text = String::with_capacity(ids.len() * 6);
    for id in ids {
        text.push_str(&id.to_string());
        text.push('\n');
    }
    std::fs::write(path, text)
        .with_context(|| format!("--ppl-predictions: cannot write {}", path.display()))
}
