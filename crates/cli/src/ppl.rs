//! `sluice run --ppl FILE`: the perplexity of a text under the model, teacher-forced (each
//! position scored against the text's next token), and the next-token hit rate (how often the
//! most likely token is the text's). `--ppl-step` runs one token per forward pass, as decode
//! does, so that everything that depends on the expert cache's state is priced as in a
//! generation; without it the text runs as one prefill.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use engine::LogitsWanted;

use runtime::decide::log_softmax_at;
use runtime::generate::Runtime;

/// Negative log-likelihood sum and hits over the positions scored.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Score {
    pub nll: f64,
    pub hits: usize,
    pub n: usize,
}

impl Score {
    /// Add one position: its logits row and the token that followed.
    pub fn add(&mut self, logits: &[f32], next: u32) {
        let lp = log_softmax_at(logits, &[next])[0];
        self.nll -= lp;
        if argmax(logits) == next as usize {
            self.hits += 1;
        }
        self.n += 1;
    }

    /// exp(mean negative log-likelihood).
    pub fn perplexity(&self) -> f64 {
        (self.nll / self.n.max(1) as f64).exp()
    }

    /// Share of positions whose most likely token was the text's, in percent.
    pub fn hit_pct(&self) -> f64 {
        100.0 * self.hits as f64 / self.n.max(1) as f64
    }
}

/// The index of the largest value (the first of equals).
fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

pub fn run(rt: &mut Runtime<'_>, path: &Path, step: bool) -> Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--ppl: cannot read {}", path.display()))?;
    let ids = rt.tokenizer.encode(&text, true, false);
    if ids.len() < 2 {
        bail!(
            "--ppl: {} is {} token(s); scoring needs at least 2",
            path.display(),
            ids.len()
        );
    }
    if ids.len() > rt.n_ctx {
        bail!(
            "--ppl: {} is {} tokens, longer than the context of {} tokens: raise -c",
            path.display(),
            ids.len(),
            rt.n_ctx
        );
    }
    let snap0 = rt.counters.snapshot();
    let t0 = Instant::now();
    let mut score = Score::default();
    let nv = rt.engine.n_vocab();
    if step {
        for w in ids.windows(2) {
            let logits = rt.engine.forward(&w[..1], LogitsWanted::Last)?;
            score.add(&logits, w[1]);
        }
    } else {
        let logits = rt
            .engine
            .forward(&ids[..ids.len() - 1], LogitsWanted::All)?;
        for (row, &next) in logits.chunks_exact(nv).zip(&ids[1..]) {
            score.add(row, next);
        }
    }
    let wall = t0.elapsed();
    let d = rt.counters.snapshot().since(&snap0);
    rt.save_history();
    let mut w = std::io::stdout().lock();
    writeln!(
        w,
        "perplexity: {:.4} over {} tokens ({:.4} nats/token), next-token hit {:.1}% ({}, {:.3} s)",
        score.perplexity(),
        score.n,
        score.nll / score.n as f64,
        score.hit_pct(),
        if step {
            "one token per forward pass"
        } else {
            "one prefill"
        },
        wall.as_secs_f64()
    )?;
    writeln!(w, "{}", rt.mode)?;
    if rt.streaming {
        for line in
            runtime::telemetry::stream_summary(&d, score.n, wall, rt.overlap, rt.cache_bytes > 0)
        {
            writeln!(w, "{line}")?;
        }
    }
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certain_model_has_perplexity_one_and_every_hit() {
        let mut s = Score::default();
        let row = [0.0f32, 1000.0, 0.0];
        s.add(&row, 1);
        s.add(&row, 1);
        assert!((s.perplexity() - 1.0).abs() < 1e-12);
        assert_eq!(s.hit_pct(), 100.0);
    }

    #[test]
    fn a_uniform_model_has_the_vocabulary_size() {
        let mut s = Score::default();
        let row = [0.5f32; 8];
        for t in [3, 5, 7] {
            s.add(&row, t);
        }
        assert!((s.perplexity() - 8.0).abs() < 1e-9, "{}", s.perplexity());
        // Ties go to the first token, which the text never had.
        assert_eq!(s.hits, 0);
        assert_eq!(s.n, 3);
    }
}
