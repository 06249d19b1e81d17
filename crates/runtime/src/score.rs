//! Scoring a text under the model: its perplexity, teacher-forced (each position scored
//! against the text's next token), and the next-token hit rate (how often the most likely
//! token is the text's). Stepped, the text runs one token per forward pass as decode does, so
//! that everything that depends on the expert cache's state is priced as in a generation;
//! otherwise it runs as one prefill.

use std::time::{Duration, Instant};

use engine::LogitsWanted;

use crate::decide::log_softmax_at;
use crate::error::{Result, reject};
use crate::generate::Runtime;
use crate::stream::StreamSnapshot;

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

    /// Mean negative log-likelihood in nats per token.
    pub fn nats_per_token(&self) -> f64 {
        self.nll / self.n.max(1) as f64
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

/// A text's score and what scoring it cost.
#[derive(Debug, Clone, Copy)]
pub struct Scored {
    pub score: Score,
    pub wall: Duration,
    /// The expert source's counters over the scoring.
    pub counters: StreamSnapshot,
}

/// Scores `text` (tokenized with BOS as the model's metadata says) from an empty context,
/// one token per pass when `step`. Refused: fewer than two tokens, or more than the context.
pub fn score_text(rt: &mut Runtime<'_>, text: &str, step: bool) -> Result<Scored> {
    let ids = rt.tokenizer.encode(text, true, false);
    if ids.len() < 2 {
        reject!(
            "the text is {} token(s); scoring needs at least 2",
            ids.len()
        );
    }
    if ids.len() > rt.n_ctx {
        reject!(
            "the text is {} tokens, longer than the context of {} tokens: raise -c",
            ids.len(),
            rt.n_ctx
        );
    }
    rt.engine.reset();
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
    let counters = rt.counters.snapshot().since(&snap0);
    rt.save_history();
    Ok(Scored {
        score,
        wall,
        counters,
    })
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
        assert!((s.nats_per_token() - 8f64.ln()).abs() < 1e-9);
        // Ties go to the first token, which the text never had.
        assert_eq!(s.hits, 0);
        assert_eq!(s.n, 3);
    }
}
