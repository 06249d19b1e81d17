//! Eviction by forecast next use.
//!
//! A decoding MoE model visits its layers in a fixed cycle, 0..N−1, once per token. Global LRU
//! is the worst policy for that pattern below one token's routed bytes: the entry it evicts
//! (the least recent) is always the one the cycle needs soonest, so it hits nothing. The
//! optimum (Bélády: evict the entry used farthest in the future) keeps what will be reused
//! soon. [`Forecast`] estimates that future from what it has seen:
//!
//! - `p`, the probability that an expert is routed at its layer's next visit: its frequency
//!   over the layer's visits so far, `(count + prior·k/n) / (visits + prior)` (with one visit's
//!   worth of a uniform prior, `k` experts of `n` routed per visit), raised to `recent` when
//!   the expert was routed at the layer's last visit (an expert routed at one token is routed at
//!   the next about 38 % of the time on a real Qwen3-30B-A3B trace, against 5 % for a random
//!   one; see docs/policy.md);
//! - `d`, the layer visits until its layer comes round again (0: the next layer batch);
//! - the expected number of layer visits until the expert is used again, `d + N·(1/p − 1)`
//!   (the next visit at `d`, then a geometric number of further tokens).
//!
//! The entry with the largest expected wait is evicted first (ties: lowest `(layer, expert)`).
//! Frequencies persist after an expert leaves the cache. Every decision depends only on the
//! batches seen so far (nothing looks ahead), so the offline replay of a trace
//! (`sluice analyze replay --policy default`) predicts the engine's hits exactly.

use std::collections::{HashMap, HashSet};

use crate::cache::{EvictionPolicy, Key, Lru};

/// How probable a reuse at the next visit is taken to be for an expert routed at its layer's
/// last visit (at least; a more frequent expert keeps its frequency).
pub const RECENT: f64 = 0.5;

/// Visits' worth of uniform prior in the frequency.
pub const PRIOR_VISITS: f64 = 1.0;

/// What the policy knows of one expert.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    /// Batches it was used in.
    count: u64,
    /// The visit (of its layer, counted from 1) of its last use.
    last_visit: u64,
    /// The batch of its last use (to count a batch once).
    last_batch: u64,
}

/// Evicts the entry whose next use is forecast farthest away; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Forecast {
    /// Position of each MoE layer in the cycle, by layer index.
    pos: HashMap<u32, usize>,
    /// Prior routing probability of one expert, `k/n`.
    base: f64,
    /// Visits of each layer so far, by position.
    visits: Vec<u64>,
    /// Visits a history's counts stand for, by position.
    prior_visits: Vec<f64>,
    /// Experts routed per visit.
    k: f64,
    /// Position of the layer of the current batch.
    cur: usize,
    batch: u64,
    seen: HashMap<Key, Seen>,
    resident: HashSet<Key>,
    /// Resident entries by descending expected wait, computed at the batch's first eviction.
    ranked: Vec<Key>,
    ranked_at: Option<u64>,
    next: usize,
}

impl Forecast {
    /// A policy for a model whose MoE layers are `moe_layers` (visited in that order), routing
    /// `k` of `n_expert` experts per token.
    pub fn new(moe_layers: &[u32], k: u32, n_expert: u32) -> Forecast {
        let mut layers = moe_layers.to_vec();
        layers.sort_unstable();
        layers.dedup();
        Forecast {
            pos: layers.iter().enumerate().map(|(i, &l)| (l, i)).collect(),
            base: f64::from(k) / f64::from(n_expert.max(1)),
            visits: vec![0; layers.len()],
            prior_visits: vec![0.0; layers.len()],
            k: f64::from(k.max(1)),
            cur: 0,
            batch: 0,
            seen: HashMap::new(),
            resident: HashSet::new(),
            ranked: Vec::new(),
            ranked_at: None,
            next: 0,
        }
    }

    /// Adds `count` past uses of `key` (a history's counts, as a prior): as if seen before this
    /// run, at `count / k` earlier visits of its layer (a visit routes `k` experts), so that the
    /// frequencies stay frequencies.
    pub fn add_history(&mut self, key: Key, count: u64) {
        let Some(&pos) = self.pos.get(&key.0) else {
            return;
        };
        self.seen.entry(key).or_default().count += count;
        self.prior_visits[pos] += count as f64 / self.k;
    }

    /// Layer visits, in the cycle, until `layer` comes round again.
    fn wait_to(&self, pos: usize) -> usize {
        let n = self.visits.len();
        (pos + n - self.cur - 1) % n
    }

    /// Expected layer visits until `key` is used again.
    pub fn expected_wait(&self, key: Key) -> f64 {
        let Some(&pos) = self.pos.get(&key.0) else {
            // Not a layer of the cycle: nothing is known of its future.
            return f64::INFINITY;
        };
        let s = self.seen.get(&key).copied().unwrap_or_default();
        let v = self.visits[pos];
        let visits = v as f64 + self.prior_visits[pos];
        let freq = (s.count as f64 + PRIOR_VISITS * self.base) / (visits + PRIOR_VISITS);
        let p = if s.last_visit == v && v > 0 {
            freq.max(RECENT)
        } else {
            freq
        }
        .clamp(1e-9, 1.0);
        let n = self.visits.len() as f64;
        self.wait_to(pos) as f64 + n * (1.0 / p - 1.0)
    }

    fn rank(&mut self) {
        let mut r: Vec<(f64, Key)> = self
            .resident
            .iter()
            .map(|&k| (self.expected_wait(k), k))
            .collect();
        // Largest wait first; equal waits lowest key first.
        r.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        self.ranked = r.into_iter().map(|(_, k)| k).collect();
        self.ranked_at = Some(self.batch);
        self.next = 0;
    }
}

impl EvictionPolicy for Forecast {
    fn name(&self) -> &'static str {
        "forecast"
    }

    fn batch(&mut self, layer: u32) {
        self.batch += 1;
        if let Some(&pos) = self.pos.get(&layer) {
            self.cur = pos;
            self.visits[pos] += 1;
        }
    }

    fn touched(&mut self, key: Key, _tick: u64) {
        let visit = self.pos.get(&key.0).map_or(0, |&p| self.visits[p]);
        let batch = self.batch;
        let s = self.seen.entry(key).or_default();
        if s.last_batch != batch || s.count == 0 {
            s.count += 1;
            s.last_batch = batch;
            s.last_visit = visit;
        }
        self.resident.insert(key);
        self.ranked_at = None;
    }

    fn admitted(&mut self, key: Key, _tick: u64) {
        // Read ahead, not routed: resident, but no use to count. The ranking stands: an entry
        // read ahead is kept through its batch (no victim before the next batch ranks anew),
        // and a read ahead that makes its room evicts down the same ranking.
        self.resident.insert(key);
    }

    fn removed(&mut self, key: Key) {
        self.resident.remove(&key);
    }

    fn history(&mut self, key: Key, count: u64) {
        self.add_history(key, count);
    }

    fn victim(&mut self, evictable: &dyn Fn(Key) -> bool) -> Option<Key> {
        if self.ranked_at != Some(self.batch) {
            self.rank();
        }
        while let Some(&k) = self.ranked.get(self.next) {
            if self.resident.contains(&k) && evictable(k) {
                return Some(k);
            }
            self.next += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_is_a_prior_in_frequencies() {
        let mut f = Forecast::new(&[0, 1], 2, 8);
        // 100 visits' worth: expert 3 in every one, expert 4 in a tenth.
        f.add_history((0, 3), 100);
        f.add_history((0, 4), 10);
        f.add_history((0, 5), 90);
        f.add_history((7, 0), 5); // not a layer of the cycle: ignored
        f.batch(1);
        // Layer 0 comes next; neither was routed in this run: frequencies rank them.
        let (w3, w4) = (f.expected_wait((0, 3)), f.expected_wait((0, 4)));
        assert!(w3 < w4, "{w3} {w4}");
        // Expert 3's frequency is 100 / 100 visits (+ the uniform prior): close to certain.
        assert!(w3 < 1.0, "{w3}");
        f.touched((0, 4), 1);
        f.touched((0, 3), 2);
        assert_eq!(f.victim(&|_| true), Some((0, 4)));
    }

    #[test]
    fn a_recent_expert_waits_less_than_a_rare_one_and_the_cycle_orders_layers() {
        let mut f = Forecast::new(&[0, 1, 2, 3], 2, 8);
        // Visit layer 0 twice using expert 1 both times, expert 2 once (first visit).
        f.batch(0);
        f.touched((0, 1), 1);
        f.touched((0, 2), 2);
        for l in 1..4 {
            f.batch(l);
        }
        f.batch(0);
        f.touched((0, 1), 3);
        // At layer 0: expert 1 used at both visits (p = 1), expert 2 once (p < 1/2).
        assert!(f.expected_wait((0, 1)) < f.expected_wait((0, 2)));
        // The same expert history one layer later in the cycle waits less (layer 1 comes next).
        f.batch(1);
        f.touched((1, 5), 4);
        f.batch(2);
        // Now at layer 2: layer 3 is next (d = 0), layer 1 farthest (d = 2).
        let mut g = f.clone();
        g.touched((3, 5), 5);
        g.seen.insert((3, 5), f.seen[&(1, 5)]);
        g.visits[3] = g.visits[1];
        assert!(g.expected_wait((3, 5)) < g.expected_wait((1, 5)));
        // An entry of a layer outside the cycle is the first to go.
        f.touched((9, 0), 6);
        assert_eq!(f.victim(&|_| true), Some((9, 0)));
        assert_eq!(f.victim(&|k| k.0 != 9), Some((0, 2)));
    }
}

/// A shadow of one pure policy: which keys a cache of the same entry count would hold under
/// it, and its decayed hit score.
#[derive(Debug, Clone, Default)]
struct Shadow {
    /// Members and the batch that last used each.
    last_batch: HashMap<Key, u64>,
    /// Members by last use (for the LRU shadow).
    order: std::collections::BTreeSet<(u64, Key)>,
    last_tick: HashMap<Key, u64>,
}

impl Shadow {
    /// A use of `key` at `tick` in `batch`: whether it was a hit (once per batch).
    fn touch(&mut self, key: Key, tick: u64, batch: u64) -> Option<bool> {
        let first = self.last_batch.insert(key, batch);
        if let Some(old) = self.last_tick.insert(key, tick) {
            self.order.remove(&(old, key));
        }
        self.order.insert((tick, key));
        match first {
            Some(b) if b == batch => None,
            Some(_) => Some(true),
            None => Some(false),
        }
    }

    fn remove(&mut self, key: Key) {
        self.last_batch.remove(&key);
        if let Some(t) = self.last_tick.remove(&key) {
            self.order.remove(&(t, key));
        }
    }

    fn len(&self) -> usize {
        self.last_batch.len()
    }
}

/// [`Forecast`] or [`Lru`], whichever has lately been the better policy here, by set dueling:
/// two shadow caches of the real cache's entry count, one kept by each policy, are run on every
/// use (membership only, no bytes); each eviction of the real cache is chosen by the policy
/// whose shadow has hit more over the recent lookups (LRU's shadow hits minus forecast's, a
/// score decayed by [`DUEL_DECAY`] a lookup; forecast unless LRU's is ahead). Forecast wins
/// below one token cycle, where LRU evicts exactly what the next layer needs; LRU where the
/// cache holds most of the working set and a frequency learned from the whole past keeps
/// experts that have gone cold. Decisions depend only on the batches seen so far, so a replay
/// predicts the engine's hits exactly.
#[derive(Debug, Clone)]
pub struct Adaptive {
    forecast: Forecast,
    lru: Lru,
    shadow_forecast: Shadow,
    shadow_lru: Shadow,
    /// The most entries the real cache has held between batches (its capacity once full).
    cap: usize,
    resident: HashSet<Key>,
    batch: u64,
    /// LRU's shadow hits minus forecast's, decayed.
    score: f64,
    /// How many evictions each policy chose (forecast, LRU).
    pub chosen: [u64; 2],
}

/// The decay of [`Adaptive`]'s score per lookup (about a thousand lookups of memory: a few
/// tokens of a large model).
pub const DUEL_DECAY: f64 = 0.999;

impl Adaptive {
    /// A policy for a model whose MoE layers are `moe_layers`, routing `k` of `n_expert`.
    pub fn new(moe_layers: &[u32], k: u32, n_expert: u32) -> Adaptive {
        Adaptive {
            forecast: Forecast::new(moe_layers, k, n_expert),
            lru: Lru::default(),
            shadow_forecast: Shadow::default(),
            shadow_lru: Shadow::default(),
            cap: 0,
            resident: HashSet::new(),
            batch: 0,
            score: 0.0,
            chosen: [0; 2],
        }
    }

    /// Trim both shadows to the capacity, never a key the current batch used.
    fn trim(&mut self) {
        let batch = self.batch;
        while self.shadow_lru.len() > self.cap {
            let sh = &self.shadow_lru;
            let Some(&(_, k)) = sh.order.iter().find(|(_, k)| sh.last_batch[k] != batch) else {
                break;
            };
            self.shadow_lru.remove(k);
        }
        let excess = self.shadow_forecast.len().saturating_sub(self.cap);
        if excess > 0 {
            let mut c: Vec<(f64, Key)> = (self.shadow_forecast.last_batch.iter())
                .filter(|(_, b)| **b != batch)
                .map(|(&k, _)| (self.forecast.expected_wait(k), k))
                .collect();
            c.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for &(_, k) in c.iter().take(excess) {
                self.shadow_forecast.remove(k);
            }
        }
    }
}

impl EvictionPolicy for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn batch(&mut self, layer: u32) {
        // What the cache holds between batches (after its evictions) is its capacity.
        self.cap = self.cap.max(self.resident.len());
        self.trim();
        self.batch += 1;
        self.forecast.batch(layer);
        self.lru.batch(layer);
    }

    fn touched(&mut self, key: Key, tick: u64) {
        self.resident.insert(key);
        let f = self.shadow_forecast.touch(key, tick, self.batch);
        let l = self.shadow_lru.touch(key, tick, self.batch);
        if let (Some(f), Some(l)) = (f, l) {
            self.score = self.score * DUEL_DECAY + f64::from(u8::from(l)) - f64::from(u8::from(f));
        }
        self.forecast.touched(key, tick);
        self.lru.touched(key, tick);
    }

    fn admitted(&mut self, key: Key, tick: u64) {
        self.resident.insert(key);
        self.forecast.admitted(key, tick);
        self.lru.admitted(key, tick);
    }

    fn removed(&mut self, key: Key) {
        self.resident.remove(&key);
        self.forecast.removed(key);
        self.lru.removed(key);
    }

    fn history(&mut self, key: Key, count: u64) {
        self.forecast.history(key, count);
    }

    fn victim(&mut self, evictable: &dyn Fn(Key) -> bool) -> Option<Key> {
        if self.score > 0.0 {
            self.chosen[1] += 1;
            self.lru.victim(evictable)
        } else {
            self.chosen[0] += 1;
            self.forecast.victim(evictable)
        }
    }
}
