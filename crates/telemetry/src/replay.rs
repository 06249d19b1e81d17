//! Offline replay of a routing trace through a fixed-budget expert cache.
//!
//! The model of the cache (the rules an expert-streaming engine's loader follows):
//!
//! - The unit of work is a **layer batch**: the experts one MoE layer routed in one forward
//!   call. In decode that is one token's `n_expert_used` rows of one layer; in prefill it is
//!   every prompt token's rows of that layer (the loader sees the whole prompt at once, and
//!   reads an expert the prompt routes twice only once). Formally, a batch is a maximal run of
//!   consecutive trace rows that share `(turn, phase, layer)` and, in decode, `step`.
//! - Each **distinct** expert of a batch is one lookup, in order of first appearance. A hit
//!   refreshes the entry; a miss reads `expert_bytes(layer)` bytes from flash and inserts the
//!   entry. A repeated expert within the batch is neither a lookup nor a read.
//! - **Eviction runs after the batch**, until the resident bytes fit the capacity, and never
//!   takes an entry the batch itself touched. A batch larger than the whole capacity therefore
//!   leaves the cache over budget until the next batch's eviction.
//! - Hit rates are reported per phase; the decode-only rate is the steady-state figure.
//!
//! Policies decide which untouched entry goes first; see [`Policy`].

use std::collections::{BTreeSet, HashMap};

use crate::{Phase, RouteTrace};

/// One layer batch: the distinct experts a layer routed in one forward call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub turn: u32,
    pub phase: Phase,
    pub layer: u32,
    /// `step` of the batch's first row (for prefill, the first token of the run).
    pub step: i64,
    /// Line of the batch's first row in the trace.
    pub first_line: usize,
    /// Distinct expert ids in order of first appearance.
    pub experts: Vec<u32>,
    /// For each row of the batch in trace order, the index into `experts` of its expert
    /// (repeats included: a repeat is no lookup, but it is a use that refreshes recency).
    pub uses: Vec<usize>,
}

/// An eviction policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Least recently used: evict the untouched entry whose last lookup is oldest. Lookups are
    /// ordered by batch, then by first appearance within the batch.
    Lru,
    /// Bélády's offline rule: evict the untouched entry whose next lookup lies farthest in the
    /// future (entries never looked up again first). Sizes vary by layer, and the rule stays
    /// "farthest next use first", one entry at a time, until the cache fits; it does not weigh
    /// size. Entries whose next use falls in the same batch are taken lowest `(layer, expert)`
    /// first. With equal sizes this is the optimum among policies that must admit every miss;
    /// with unequal sizes it is the classic approximation of it.
    Belady,
}

impl Policy {
    /// The policy's name as used on the command line and in CSV output.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Belady => "belady",
        }
    }

    /// Parses a name as [`Policy::name`] writes it (case-insensitive; `bélády` also accepted).
    pub fn from_name(name: &str) -> Option<Policy> {
        match name.trim().to_ascii_lowercase().as_str() {
            "lru" => Some(Policy::Lru),
            "belady" | "bélády" | "opt" | "min" => Some(Policy::Belady),
            _ => None,
        }
    }
}

/// Lookups, hits and read bytes of one phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseCounts {
    /// Distinct experts looked up (one per expert per layer batch).
    pub lookups: u64,
    pub hits: u64,
    /// Bytes read from flash by the misses.
    pub miss_bytes: u64,
}

impl PhaseCounts {
    /// Hit percentage (0 when there were no lookups).
    pub fn hit_pct(&self) -> f64 {
        if self.lookups == 0 {
            0.0
        } else {
            100.0 * self.hits as f64 / self.lookups as f64
        }
    }

    fn add(&self, other: &PhaseCounts) -> PhaseCounts {
        PhaseCounts {
            lookups: self.lookups + other.lookups,
            hits: self.hits + other.hits,
            miss_bytes: self.miss_bytes + other.miss_bytes,
        }
    }
}

/// The outcome of one replay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplayStats {
    /// The policy's name ([`Policy::name`], or the name a [`CacheModel`] replay was given).
    pub policy: &'static str,
    pub capacity_bytes: u64,
    pub prefill: PhaseCounts,
    pub decode: PhaseCounts,
    /// Decoded tokens (distinct `(turn, step)` in the decode phase).
    pub decode_tokens: usize,
    /// The most bytes resident after any batch's eviction (above the capacity only when one
    /// batch alone needs more than the capacity).
    pub peak_resident_bytes: u64,
}

impl ReplayStats {
    /// Both phases together.
    pub fn total(&self) -> PhaseCounts {
        self.prefill.add(&self.decode)
    }

    /// Flash MiB read per decoded token (0 without decode).
    pub fn decode_miss_mib_per_token(&self) -> f64 {
        if self.decode_tokens == 0 {
            0.0
        } else {
            self.decode.miss_bytes as f64 / MIB as f64 / self.decode_tokens as f64
        }
    }
}

/// Bytes in one MiB (budgets are given in MiB = 2^20 bytes).
pub const MIB: u64 = 1 << 20;

type Key = (u32, u32); // (layer, expert)

/// A trace prepared for replay: its batches, per-expert sizes and next-use table.
#[derive(Clone, Debug)]
pub struct Workload {
    batches: Vec<Batch>,
    /// `next_use[b][j]`: index of the next batch that looks up `batches[b].experts[j]`'s key,
    /// `usize::MAX` if none.
    next_use: Vec<Vec<usize>>,
    /// `expert_bytes` per layer index.
    layer_bytes: HashMap<u32, u64>,
    decode_tokens: usize,
}

impl Workload {
    /// Groups the trace into layer batches and precomputes next uses.
    pub fn new(trace: &RouteTrace) -> Workload {
        let batches = batches(trace);
        let mut next_use: Vec<Vec<usize>> = batches
            .iter()
            .map(|b| vec![usize::MAX; b.experts.len()])
            .collect();
        let mut upcoming: HashMap<Key, usize> = HashMap::new();
        for (b, batch) in batches.iter().enumerate().rev() {
            for (j, &expert) in batch.experts.iter().enumerate() {
                let key = (batch.layer, expert);
                if let Some(&next) = upcoming.get(&key) {
                    next_use[b][j] = next;
                }
                upcoming.insert(key, b);
            }
        }
        let layer_bytes = trace
            .layers
            .iter()
            .map(|(&l, info)| (l, info.expert_bytes))
            .collect();
        Workload {
            batches,
            next_use,
            layer_bytes,
            decode_tokens: trace.decode_tokens(),
        }
    }

    /// The layer batches in replay order.
    pub fn batches(&self) -> &[Batch] {
        &self.batches
    }

    /// Replays every batch through a cache of `capacity_bytes` under `policy`.
    pub fn replay(&self, policy: Policy, capacity_bytes: u64) -> ReplayStats {
        let mut cache = Cache::default();
        let mut stats = ReplayStats {
            policy: policy.name(),
            capacity_bytes,
            prefill: PhaseCounts::default(),
            decode: PhaseCounts::default(),
            decode_tokens: self.decode_tokens,
            peak_resident_bytes: 0,
        };
        let mut tick: u64 = 0;
        for (b, batch) in self.batches.iter().enumerate() {
            let size = self.layer_bytes.get(&batch.layer).copied().unwrap_or(0);
            let counts = match batch.phase {
                Phase::Prefill => &mut stats.prefill,
                Phase::Decode => &mut stats.decode,
            };
            let mut looked_up = vec![false; batch.experts.len()];
            for &j in &batch.uses {
                let key = (batch.layer, batch.experts[j]);
                // Lower rank = evicted sooner.
                let rank = match policy {
                    Policy::Lru => tick,
                    Policy::Belady => u64::MAX - self.next_use[b][j] as u64,
                };
                tick += 1;
                if looked_up[j] {
                    // A repeat within the batch: already resident, only its rank moves.
                    cache.touch(key, rank, b);
                    continue;
                }
                looked_up[j] = true;
                counts.lookups += 1;
                if cache.touch(key, rank, b) {
                    counts.hits += 1;
                } else {
                    counts.miss_bytes += size;
                    cache.insert(key, size, rank, b);
                }
            }
            cache.evict_to(capacity_bytes, b);
            stats.peak_resident_bytes = stats.peak_resident_bytes.max(cache.used);
        }
        stats
    }
}

/// A cache the replay drives batch by batch under its own policy — an engine's expert cache,
/// so that a replay measures the shipped code. It must follow the rules of the
/// [module docs](self) (eviction after the batch, never an entry the batch touched).
pub trait CacheModel {
    /// A batch of `layer` starts (a decode batch: one token's routing).
    fn begin_batch(&mut self, layer: u32, decode: bool);
    /// The lookup of a distinct expert of the batch: `true` on a hit; a miss admits it
    /// (`bytes` big).
    fn lookup(&mut self, key: (u32, u32), bytes: u64) -> bool;
    /// A repeat of an expert within the batch (no lookup).
    fn touch(&mut self, key: (u32, u32));
    /// The batch ends (the cache evicts).
    fn end_batch(&mut self);
    /// Bytes resident now.
    fn resident_bytes(&self) -> u64;
}

impl Workload {
    /// Replays every batch through `model` (a cache of `capacity_bytes` under the policy
    /// named `policy`), counting as [`replay`](Self::replay) does.
    pub fn replay_model(
        &self,
        policy: &'static str,
        model: &mut dyn CacheModel,
        capacity_bytes: u64,
    ) -> ReplayStats {
        let mut stats = ReplayStats {
            policy,
            capacity_bytes,
            prefill: PhaseCounts::default(),
            decode: PhaseCounts::default(),
            decode_tokens: self.decode_tokens,
            peak_resident_bytes: 0,
        };
        for batch in &self.batches {
            let size = self.layer_bytes.get(&batch.layer).copied().unwrap_or(0);
            let counts = match batch.phase {
                Phase::Prefill => &mut stats.prefill,
                Phase::Decode => &mut stats.decode,
            };
            model.begin_batch(batch.layer, batch.phase == Phase::Decode);
            let mut looked_up = vec![false; batch.experts.len()];
            for &j in &batch.uses {
                let key = (batch.layer, batch.experts[j]);
                if looked_up[j] {
                    model.touch(key);
                    continue;
                }
                looked_up[j] = true;
                counts.lookups += 1;
                if model.lookup(key, size) {
                    counts.hits += 1;
                } else {
                    counts.miss_bytes += size;
                }
            }
            model.end_batch();
            stats.peak_resident_bytes = stats.peak_resident_bytes.max(model.resident_bytes());
        }
        stats
    }
}

/// Replays `trace` once; see [`Workload`] to replay one trace at many budgets.
pub fn replay(trace: &RouteTrace, policy: Policy, capacity_bytes: u64) -> ReplayStats {
    Workload::new(trace).replay(policy, capacity_bytes)
}

/// Groups a trace's rows into layer batches (see the module documentation).
pub fn batches(trace: &RouteTrace) -> Vec<Batch> {
    let mut out: Vec<Batch> = Vec::new();
    let mut current: Option<(u32, Phase, u32, Option<i64>)> = None;
    for row in &trace.rows {
        let key = (
            row.turn,
            row.phase,
            row.layer,
            (row.phase == Phase::Decode).then_some(row.step),
        );
        if current != Some(key) {
            current = Some(key);
            out.push(Batch {
                turn: row.turn,
                phase: row.phase,
                layer: row.layer,
                step: row.step,
                first_line: row.line,
                experts: Vec::new(),
                uses: Vec::new(),
            });
        }
        if let Some(batch) = out.last_mut() {
            let j = match batch.experts.iter().position(|&e| e == row.expert) {
                Some(j) => j,
                None => {
                    batch.experts.push(row.expert);
                    batch.experts.len() - 1
                }
            };
            batch.uses.push(j);
        }
    }
    out
}

#[derive(Default)]
struct Cache {
    /// key -> (size, rank, batch that last touched it)
    entries: HashMap<Key, (u64, u64, usize)>,
    /// (rank, key), lowest rank evicted first
    order: BTreeSet<(u64, Key)>,
    used: u64,
}

impl Cache {
    /// Looks `key` up; on a hit re-ranks it and marks it touched by `batch`.
    fn touch(&mut self, key: Key, rank: u64, batch: usize) -> bool {
        let Some(entry) = self.entries.get_mut(&key) else {
            return false;
        };
        self.order.remove(&(entry.1, key));
        entry.1 = rank;
        entry.2 = batch;
        self.order.insert((rank, key));
        true
    }

    fn insert(&mut self, key: Key, size: u64, rank: u64, batch: usize) {
        self.entries.insert(key, (size, rank, batch));
        self.order.insert((rank, key));
        self.used += size;
    }

    /// Evicts lowest-rank entries not touched by `batch` until `used <= capacity`.
    fn evict_to(&mut self, capacity: u64, batch: usize) {
        while self.used > capacity {
            let victim = self
                .order
                .iter()
                .find(|(_, key)| self.entries.get(key).is_some_and(|e| e.2 != batch))
                .copied();
            let Some((rank, key)) = victim else {
                return; // only this batch's entries are left
            };
            self.order.remove(&(rank, key));
            if let Some((size, _, _)) = self.entries.remove(&key) {
                self.used -= size;
            }
        }
    }
}
