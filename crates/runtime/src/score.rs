//! Scoring a text under the model: its perplexity, teacher-forced (each position scored
//! against the text's next token), and the next-token hit rate (how often the most likely
//! token is the text's). Stepped, the text runs one token per forward pass as decode does, so
//! that everything that depends on the expert cache's state is priced as in a generation;
//! otherwise it runs as one prefill.

use crate::refusal::{Refusal, Setting, problem};
use std::time::{Duration, Instant};

use engine::LogitsWanted;

use crate::decide::log_softmax_at;
use crate::error::{Error, Result, reject};
use crate::generate::Runtime;
use crate::source::StreamSnapshot;

/// Negative log-likelihood sum and hits over the positions scored.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Score {
    pub nll: f64,
    pub hits: usize,
    pub n: usize,
}

impl Score {
    /// Add one position: its logits row and the token that followed. Returns the position's
    /// most likely token (the first of equals).
    pub fn add(&mut self, logits: &[f32], next: u32) -> u32 {
        let lp = log_softmax_at(logits, &[next])[0];
        self.nll -= lp;
        let best = argmax(logits);
        if best == next as usize {
            self.hits += 1;
        }
        self.n += 1;
        // (a vocabulary index: the engine refuses a vocabulary past u32)
        u32::try_from(best).unwrap_or(u32::MAX)
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
#[derive(Debug, Clone)]
pub struct Scored {
    pub score: Score,
    /// Each position's most likely next token, in order (what a lossy setting's agreement
    /// with the baseline is counted on).
    pub predicted: Vec<u32>,
    pub wall: Duration,
    /// The expert source's counters over the scoring.
    pub counters: StreamSnapshot,
    /// What the cache-aware routing policies did over the scoring.
    pub cache_aware: engine::CacheAwareCounts,
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
        return Err(Error::Rejected(Refusal::ContextFull {
            tokens: ids.len(),
            n_ctx: rt.n_ctx,
            problem: problem!(
                format!(
                    "the text is {} tokens, longer than the context of {} tokens: raise ",
                    ids.len(),
                    rt.n_ctx
                ),
                Setting::Context,
            ),
        }));
    }
    rt.engine.reset();
    let snap0 = rt.counters.snapshot();
    let ca0 = rt.engine.cache_aware_counts();
    let t0 = Instant::now();
    let mut score = Score::default();
    let mut predicted = Vec::with_capacity(ids.len() - 1);
    let nv = rt.engine.n_vocab();
    if step {
        for w in ids.windows(2) {
            let logits = rt.engine.forward(&w[..1], LogitsWanted::Last)?;
            predicted.push(score.add(&logits, w[1]));
        }
    } else {
        let logits = rt
            .engine
            .forward(&ids[..ids.len() - 1], LogitsWanted::All)?;
        for (row, &next) in logits.chunks_exact(nv).zip(&ids[1..]) {
            predicted.push(score.add(row, next));
        }
    }
    let wall = t0.elapsed();
    let counters = rt.counters.snapshot().since(&snap0);
    let cache_aware = rt.engine.cache_aware_counts().since(&ca0);
    rt.save_history();
    Ok(Scored {
        score,
        predicted,
        wall,
        counters,
        cache_aware,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certain_model_has_perplexity_one_and_every_hit() {
        let mut s = Score::default();
        let row = [0.0f32, 1000.0, 0.0];
        assert_eq!(s.add(&row, 1), 1);
        assert_eq!(s.add(&row, 1), 1);
        assert!((s.perplexity() - 1.0).abs() < 1e-12);
        assert_eq!(s.hit_pct(), 100.0);
    }

    #[test]
    fn a_uniform_model_has_the_vocabulary_size() {
        let mut s = Score::default();
        let row = [0.5f32; 8];
        for t in [3, 5, 7] {
            assert_eq!(s.add(&row, t), 0);
        }
        assert!((s.perplexity() - 8.0).abs() < 1e-9, "{}", s.perplexity());
        assert!((s.nats_per_token() - 8f64.ln()).abs() < 1e-9);
        // Ties go to the first token, which the text never had.
        assert_eq!(s.hits, 0);
        assert_eq!(s.n, 3);
    }
}
