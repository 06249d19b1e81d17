//! Co-activation prefetch: which experts of the next MoE layers a token is likely to route,
//! given what it routed in this one.
//!
//! A token's hidden state changes little from one layer to the next, so the experts it routes
//! in a layer say much about those it routes in the next (on a real Qwen3-30B-A3B trace the
//! previous layer's experts name 55 % of the next layer's top-6, against 39 % for the same
//! layer's experts at the previous token; docs/policy.md). A [`Couple`] table holds, for each
//! (layer, expert) and each lookahead `d` (1: the next MoE layer, 2: the one after), the
//! experts of layer `+d` that followed it and how often: `P(next | expert)`. `sluice analyze
//! pairs` builds it from routing traces; the expert store reads the predicted experts of the
//! next layers while the current one computes.
//!
//! The file is `sluice pairs v1`, whose records, writer and parser are `telemetry::pairs`; a
//! [`Couple`] is built from its entries.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use telemetry::pairs::Pairs;

/// What is wrong with a pairs file; names the file and line.
#[derive(Debug, thiserror::Error)]
pub enum CoupleError {
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}:{line}: {msg}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        msg: String,
    },
}

/// A co-activation table; see the [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct Couple {
    /// (layer, expert, d) → (next expert, probability), most likely first.
    next: HashMap<(u32, u32, u32), Vec<(u32, f32)>>,
    /// Largest lookahead in the table.
    pub depth: u32,
}

impl Couple {
    /// An empty table (entries are added with [`insert`](Self::insert)).
    pub fn new() -> Couple {
        Couple::default()
    }

    /// Sets the entry of `expert` in `layer` at lookahead `d`.
    pub fn insert(&mut self, layer: u32, expert: u32, d: u32, next: Vec<(u32, f32)>) {
        self.depth = self.depth.max(d);
        self.next.insert((layer, expert, d), next);
    }

    /// The entry of `expert` in `layer` at lookahead `d`.
    pub fn get(&self, layer: u32, expert: u32, d: u32) -> &[(u32, f32)] {
        self.next
            .get(&(layer, expert, d))
            .map_or(&[], Vec::as_slice)
    }

    /// Reads a pairs file.
    pub fn read(path: &Path) -> Result<Couple, CoupleError> {
        let text = std::fs::read_to_string(path).map_err(|error| CoupleError::Io {
            path: path.to_owned(),
            error,
        })?;
        Couple::parse(&text).map_err(|(line, msg)| CoupleError::Parse {
            path: path.to_owned(),
            line,
            msg,
        })
    }

    /// Parses a pairs file's text; errors carry the 1-based line.
    pub fn parse(text: &str) -> Result<Couple, (usize, String)> {
        let pairs = Pairs::parse(text).map_err(|e| (e.line, e.msg))?;
        Ok(Couple::from_pairs(pairs))
    }

    /// The table of a parsed pairs file's entries.
    pub fn from_pairs(pairs: Pairs) -> Couple {
        let mut c = Couple::new();
        for e in pairs.entries {
            c.insert(e.layer, e.expert, e.d, e.next);
        }
        c
    }

    /// The experts of the MoE layer `d` on from `layer` most likely routed by a token that
    /// routed `routed` in `layer`: each candidate scored by the sum of its probabilities after
    /// the routed experts, the `k` best with a positive score, best first (ties: lower id).
    pub fn predict(&self, layer: u32, routed: &[u32], d: u32, k: usize) -> Vec<u32> {
        let mut score: HashMap<u32, f32> = HashMap::new();
        for &e in routed {
            for &(n, p) in self.get(layer, e, d) {
                *score.entry(n).or_insert(0.0) += p;
            }
        }
        let mut v: Vec<(u32, f32)> = score.into_iter().filter(|&(_, s)| s > 0.0).collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v.into_iter().take(k).map(|(e, _)| e).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_predicts_the_likeliest_followers() {
        let text = "# sluice pairs v1\n# n_layer=2 n_expert=8 depth=1 tokens=10\n\
                    0 1 1 10 3:0.9000 4:0.5000\n0 2 1 5 4:0.6000 5:0.2000\n";
        let c = Couple::parse(text).unwrap();
        assert_eq!(c.depth, 1);
        // 4 follows both (1.1), 3 one (0.9), 5 (0.2).
        assert_eq!(c.predict(0, &[1, 2], 1, 2), vec![4, 3]);
        assert_eq!(c.predict(0, &[1, 2], 1, 9), vec![4, 3, 5]);
        assert!(c.predict(1, &[1], 1, 4).is_empty());
        for (bad, line) in [
            ("0 1 1 10 3:0.9\n", 1),
            ("# sluice pairs v1\n0 1 1\n", 2),
            ("# sluice pairs v1\n0 1 0 3 2:0.5\n", 2),
            ("# sluice pairs v1\n0 1 1 3 2:1.5\n", 2),
            ("# sluice pairs v1\n\n0 1 1 3 2-0.5\n", 3),
        ] {
            assert_eq!(Couple::parse(bad).unwrap_err().0, line, "{bad}");
        }
    }
}
