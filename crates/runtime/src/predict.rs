//! What the engine ranked ahead of the router, scored: `--predict-log`'s three predictors
//! (stale gate, previous token, fresh-gate control) against the routing each one-token pass
//! used, per layer, and route-ahead's ledger (routings committed, passed through, and how often
//! the committed selection agreed with the router).
//!
//! A predictor is scored on a routing only when it named something for it: the stale gate has
//! nothing for the first MoE layer, the previous-token bet nothing for a layer's first one-token
//! pass. Routings wider than [`MAX_SCORED`] experts are declined. The figures are cumulative;
//! [`AheadFigures::since`] takes a generation's share.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use engine::{Foresight, ForesightTap};

/// The widest routing scored (wider ones are declined rather than scored on a truncation).
pub const MAX_SCORED: usize = 32;

/// One predictor's record at one layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Score {
    /// Routings scored.
    pub rows: u64,
    /// Routed slots scored, and those the predictor had named.
    pub slots: u64,
    pub hit: u64,
    /// Routings it named entirely.
    pub whole: u64,
}

impl Score {
    fn add(&mut self, predicted: &[usize], used: &[usize]) {
        let hit = used.iter().filter(|e| predicted.contains(e)).count() as u64;
        self.rows += 1;
        self.slots += used.len() as u64;
        self.hit += hit;
        self.whole += u64::from(hit == used.len() as u64);
    }

    fn merge(&mut self, o: &Score) {
        self.rows += o.rows;
        self.slots += o.slots;
        self.hit += o.hit;
        self.whole += o.whole;
    }

    /// Share of the scored slots it named, in percent (`None` when nothing was scored).
    pub fn slot_pct(&self) -> Option<f64> {
        (self.slots > 0).then(|| 100.0 * self.hit as f64 / self.slots as f64)
    }

    /// Share of the scored routings it named whole, in percent.
    pub fn whole_pct(&self) -> Option<f64> {
        (self.rows > 0).then(|| 100.0 * self.whole as f64 / self.rows as f64)
    }

    fn since(&self, e: &Score) -> Score {
        Score {
            rows: self.rows - e.rows,
            slots: self.slots - e.slots,
            hit: self.hit - e.hit,
            whole: self.whole - e.whole,
        }
    }
}

/// The three predictors at one layer, and the layer's one-token routings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerScores {
    pub stale: Score,
    pub prev: Score,
    pub control: Score,
    pub routings: u64,
}

/// Everything scored so far (cumulative).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AheadFigures {
    /// By layer.
    pub layers: BTreeMap<usize, LayerScores>,
    /// One-token routings the stale gate was asked for and could not rank (the first MoE
    /// layer), and routings declined for their width.
    pub unranked: u64,
    pub declined: u64,
    /// Route-ahead: routings committed, passed through (no ranking to commit), and the
    /// committed slots the router's own top-k also held.
    pub committed: u64,
    pub passed: u64,
    pub committed_slots: u64,
    pub agreed_slots: u64,
    /// Time spent ranking ahead, in nanoseconds.
    pub rank_ns: u64,
}

impl AheadFigures {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &AheadFigures) -> AheadFigures {
        let layers = self
            .layers
            .iter()
            .map(|(&l, s)| {
                let e = earlier.layers.get(&l).copied().unwrap_or_default();
                (
                    l,
                    LayerScores {
                        stale: s.stale.since(&e.stale),
                        prev: s.prev.since(&e.prev),
                        control: s.control.since(&e.control),
                        routings: s.routings - e.routings,
                    },
                )
            })
            .collect();
        AheadFigures {
            layers,
            unranked: self.unranked - earlier.unranked,
            declined: self.declined - earlier.declined,
            committed: self.committed - earlier.committed,
            passed: self.passed - earlier.passed,
            committed_slots: self.committed_slots - earlier.committed_slots,
            agreed_slots: self.agreed_slots - earlier.agreed_slots,
            rank_ns: self.rank_ns - earlier.rank_ns,
        }
    }

    /// Each predictor over every layer.
    pub fn totals(&self) -> LayerScores {
        let mut t = LayerScores::default();
        for s in self.layers.values() {
            t.stale.merge(&s.stale);
            t.prev.merge(&s.prev);
            t.control.merge(&s.control);
            t.routings += s.routings;
        }
        t
    }

    /// Route-ahead's agreement: committed slots the router's top-k also held, in percent
    /// (0 when nothing was committed).
    pub fn agree_pct(&self) -> f64 {
        if self.committed_slots == 0 {
            0.0
        } else {
            100.0 * self.agreed_slots as f64 / self.committed_slots as f64
        }
    }
}

/// The scorer the engine's foresight tap feeds.
#[derive(Clone, Default)]
pub struct PredictLog {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    /// The passes being run are decode steps (a one-token prefill is not scored).
    decode: bool,
    figures: AheadFigures,
    /// Each layer's routing at its last one-token pass.
    prev: BTreeMap<usize, Vec<usize>>,
}

impl PredictLog {
    /// The figures so far.
    pub fn figures(&self) -> AheadFigures {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .figures
            .clone()
    }

    /// Score the passes that follow (decode steps) or not (a prefill).
    pub fn set_decode(&self, decode: bool) {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .decode = decode;
    }

    /// The engine tap that scores every one-token routing of a decode step.
    pub fn tap<'a>(&self) -> ForesightTap<'a> {
        let inner = Arc::clone(&self.inner);
        Box::new(move |f: &Foresight<'_>| {
            let mut g = inner.lock().unwrap_or_else(PoisonError::into_inner);
            g.record(f);
        })
    }
}

impl Inner {
    fn record(&mut self, f: &Foresight<'_>) {
        if !self.decode {
            return;
        }
        let fig = &mut self.figures;
        fig.rank_ns += f.rank_ns;
        if f.committed {
            fig.committed += 1;
            if let Some(router) = f.router {
                fig.committed_slots += f.used.len() as u64;
                fig.agreed_slots += f.used.iter().filter(|e| router.contains(e)).count() as u64;
            }
        } else if !f.replayed {
            fig.passed += 1;
        }
        let prev = self.prev.entry(f.layer).or_default();
        if f.used.len() > MAX_SCORED {
            fig.declined += 1;
        } else {
            let s = fig.layers.entry(f.layer).or_default();
            s.routings += 1;
            match f.stale {
                Some(p) => s.stale.add(p, f.used),
                None => fig.unranked += 1,
            }
            // (empty before the layer's first decode step)
            if !prev.is_empty() {
                s.prev.add(prev, f.used);
            }
            if let Some(c) = f.control {
                s.control.add(c, f.used);
            }
        }
        prev.clear();
        prev.extend_from_slice(f.used);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event<'r>(
        layer: usize,
        used: &'r [usize],
        stale: Option<&'r [usize]>,
        control: Option<&'r [usize]>,
    ) -> Foresight<'r> {
        Foresight {
            layer,
            used,
            router: None,
            stale,
            control,
            committed: false,
            replayed: false,
            rank_ns: 0,
        }
    }

    #[test]
    fn each_predictor_is_scored_on_the_routings_it_named() {
        let log = PredictLog::default();
        let mut tap = log.tap();
        // a one-token prefill is not scored
        tap(&event(0, &[7, 8], None, Some(&[7, 8])));
        log.set_decode(true);
        // token 1: layer 0 has no stale ranking; layer 1's names one of two
        tap(&event(0, &[1, 2], None, Some(&[2, 1])));
        tap(&event(1, &[3, 4], Some(&[4, 7]), Some(&[3, 4])));
        // token 2: the previous token named both of layer 0's, one of layer 1's
        tap(&event(0, &[2, 1], None, Some(&[2, 1])));
        tap(&event(1, &[4, 5], Some(&[4, 5]), Some(&[4, 5])));
        let f = log.figures();
        let l0 = f.layers[&0];
        assert_eq!(l0.stale, Score::default());
        assert_eq!(
            l0.prev,
            Score {
                rows: 1,
                slots: 2,
                hit: 2,
                whole: 1
            }
        );
        assert_eq!(l0.control.hit, 4);
        let l1 = f.layers[&1];
        assert_eq!(
            l1.stale,
            Score {
                rows: 2,
                slots: 4,
                hit: 3,
                whole: 1
            }
        );
        assert_eq!(l1.prev.hit, 1);
        assert_eq!(f.unranked, 2);
        // a generation's share
        let later = log.figures();
        assert_eq!(later.since(&f).totals(), LayerScores::default());
    }

    #[test]
    fn route_ahead_counts_commits_passes_and_agreement() {
        let log = PredictLog::default();
        log.set_decode(true);
        let mut tap = log.tap();
        let mut e = event(2, &[1, 2, 3, 4], None, None);
        e.committed = true;
        e.router = Some(&[1, 2, 5, 6]);
        tap(&e);
        tap(&event(0, &[1, 2], None, None));
        let f = log.figures();
        assert_eq!((f.committed, f.passed), (1, 1));
        assert_eq!(f.agree_pct(), 50.0);
    }
}
