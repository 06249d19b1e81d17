//! The bounded expert cache: slots keyed by (layer, expert), each holding all of an expert's
//! bytes, within a byte budget.
//!
//! The rules (the same as the offline replay's, `telemetry::replay`, so that a replay predicts the
//! engine's hit rate exactly):
//!
//! - Work comes in **layer batches**: the experts one MoE layer routed in one forward call
//!   ([`ExpertCache::begin_batch`] … [`ExpertCache::end_batch`]).
//! - Each distinct expert of a batch is one [`lookup`](ExpertCache::lookup): a hit refreshes
//!   the entry; a miss takes a slot (a recycled buffer when one of the size is free) for the
//!   caller to fill. A repeat within the batch is no lookup, only a
//!   [`touch`](ExpertCache::touch) that refreshes recency.
//! - **Eviction runs once the batch's lookups are done** ([`ExpertCache::make_room`], before
//!   the misses take buffers; [`ExpertCache::end_batch`] otherwise), until the slots fit the
//!   budget, and never takes an entry the batch touched (it is in use). A batch larger than
//!   the budget leaves the cache over budget until the next batch ends. With a budget of 0 there is no cache:
//!   every slot is freed (for reuse) when its batch ends — a per-layer staging area.
//!
//! Which untouched entry leaves first is the [`EvictionPolicy`]'s choice: [`Lru`], or
//! [`Forecast`](crate::policy::Forecast) (see [`policy`](crate::policy)).

use std::collections::{BTreeSet, HashMap, HashSet};

/// A cached expert: (layer, expert).
pub type Key = (u32, u32);

/// Alignment of slot buffers: what O_DIRECT reads need (covers 512- and 4096-byte sectors).
pub const SLOT_ALIGN: usize = 4096;

/// Freed slots kept per slot size for reuse by a cache of 0 (a staging area: a decode batch
/// takes at most top-k new slots). A cache with a budget keeps every freed slot that fits in
/// it: a buffer used again is memory already faulted in, where a new one costs the kernel a
/// zeroed page per 4 KiB on the lane that reads into it, beside the compute (docs/store.md).
const FREE_SLOTS_KEPT: usize = 8;

/// Decides which cached expert leaves first.
pub trait EvictionPolicy {
    /// A short name (`lru`).
    fn name(&self) -> &'static str;
    /// `key` was used at logical time `tick` (ticks only grow): looked up, inserted, or used
    /// again within its batch.
    fn touched(&mut self, key: Key, tick: u64);
    /// `key` left the cache.
    fn removed(&mut self, key: Key);
    /// The entry to evict next among those `evictable` accepts; `None` when there is none.
    fn victim(&mut self, evictable: &dyn Fn(Key) -> bool) -> Option<Key>;
    /// A layer batch of `layer` starts (before its lookups).
    fn batch(&mut self, _layer: u32) {}
    /// `key` entered the cache without a lookup (read ahead); by default a use at `tick`.
    fn admitted(&mut self, key: Key, tick: u64) {
        self.touched(key, tick);
    }
    /// `count` uses of `key` before this run (a usage history), for a policy that learns.
    fn history(&mut self, _key: Key, _count: u64) {}
}

impl<P: EvictionPolicy + ?Sized> EvictionPolicy for Box<P> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn touched(&mut self, key: Key, tick: u64) {
        (**self).touched(key, tick);
    }
    fn removed(&mut self, key: Key) {
        (**self).removed(key);
    }
    fn victim(&mut self, evictable: &dyn Fn(Key) -> bool) -> Option<Key> {
        (**self).victim(evictable)
    }
    fn batch(&mut self, layer: u32) {
        (**self).batch(layer);
    }
    fn history(&mut self, key: Key, count: u64) {
        (**self).history(key, count);
    }
    fn admitted(&mut self, key: Key, tick: u64) {
        (**self).admitted(key, tick);
    }
}

/// Least recently used first.
#[derive(Debug, Default, Clone)]
pub struct Lru {
    last: HashMap<Key, u64>,
    order: BTreeSet<(u64, Key)>,
}

impl EvictionPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn touched(&mut self, key: Key, tick: u64) {
        if let Some(old) = self.last.insert(key, tick) {
            self.order.remove(&(old, key));
        }
        self.order.insert((tick, key));
    }

    fn removed(&mut self, key: Key) {
        if let Some(old) = self.last.remove(&key) {
            self.order.remove(&(old, key));
        }
    }

    fn victim(&mut self, evictable: &dyn Fn(Key) -> bool) -> Option<Key> {
        self.order.iter().map(|&(_, k)| k).find(|&k| evictable(k))
    }
}

/// A heap buffer whose usable part starts at a [`SLOT_ALIGN`] boundary.
#[derive(Debug)]
pub struct AlignedBuf {
    raw: Vec<u8>,
    at: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes at an aligned address.
    pub fn new(len: usize) -> AlignedBuf {
        if len == 0 {
            return AlignedBuf {
                raw: Vec::new(),
                at: 0,
                len: 0,
            };
        }
        let raw = vec![0u8; len + SLOT_ALIGN];
        let at = raw.as_ptr().align_offset(SLOT_ALIGN).min(SLOT_ALIGN);
        AlignedBuf { raw, at, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.at..self.at + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.at..self.at + self.len]
    }
}

/// Counters since the cache was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Distinct experts looked up (one per expert per batch).
    pub lookups: u64,
    pub hits: u64,
    /// Bytes of the slots the misses took (what they read).
    pub miss_bytes: u64,
    /// Entries evicted.
    pub evictions: u64,
    /// Misses of experts that had been cached before and evicted.
    pub rereads: u64,
    /// Most bytes held in slots at once (at the end of a batch: the eviction's result).
    pub peak_bytes: u64,
    /// Experts read ahead of their lookup ([`ExpertCache::prefetch`]), and their bytes.
    pub prefetches: u64,
    pub prefetch_bytes: u64,
    /// Lookups that hit an entry read ahead (the first lookup after its prefetch).
    pub prefetch_hits: u64,
}

/// `hits` per `lookups`, in percent (0 without lookups): the hit rate every report of a cache
/// prints.
pub fn hit_pct(hits: u64, lookups: u64) -> f64 {
    if lookups == 0 {
        0.0
    } else {
        100.0 * hits as f64 / lookups as f64
    }
}

impl CacheStats {
    /// Hits per lookup, in percent (0 without lookups).
    pub fn hit_pct(&self) -> f64 {
        hit_pct(self.hits, self.lookups)
    }
}

/// Whether a lookup found the expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Its slot holds the expert's bytes.
    Hit,
    /// A fresh slot was taken; the caller fills it before use.
    Miss,
}

struct Entry {
    buf: AlignedBuf,
    /// Bytes of its slot (also while the buffer is lent out by [`ExpertCache::take_slot`]).
    size: usize,
    /// The batch that last touched it.
    batch: u64,
    /// It has had a buffer (a miss gets one when first used).
    filled: bool,
    /// Pinned: never evicted.
    pinned: bool,
    /// Read ahead and not looked up since.
    prefetched: bool,
    /// Read ahead for a layer that will route it: not evicted before that layer's batch.
    held: bool,
}

/// The cache; see the [module docs](self).
pub struct ExpertCache<P: EvictionPolicy = Lru> {
    budget: u64,
    entries: HashMap<Key, Entry>,
    used: u64,
    free: HashMap<usize, Vec<AlignedBuf>>,
    policy: P,
    batch: u64,
    tick: u64,
    ever_evicted: HashSet<Key>,
    stats: CacheStats,
    /// Bytes of the freed buffers kept in `free`.
    pooled: u64,
    /// Bytes of entries that missed and have no buffer yet.
    unfilled: u64,
    /// Bytes of the pinned entries.
    pinned_bytes: u64,
    /// Entries held for their layer's next batch ([`ExpertCache::prefetch_held`]).
    held: Vec<Key>,
}

impl<P: EvictionPolicy> ExpertCache<P> {
    /// A cache of `budget_bytes` (0: no cache, a staging area) under `policy`.
    pub fn new(budget_bytes: u64, policy: P) -> ExpertCache<P> {
        ExpertCache {
            budget: budget_bytes,
            entries: HashMap::new(),
            used: 0,
            free: HashMap::new(),
            policy,
            batch: 0,
            tick: 0,
            ever_evicted: HashSet::new(),
            stats: CacheStats::default(),
            pooled: 0,
            unfilled: 0,
            pinned_bytes: 0,
            held: Vec::new(),
        }
    }

    /// Start a batch of `layer`.
    pub fn begin_batch(&mut self, layer: u32) {
        self.batch += 1;
        // Entries held for this layer are its to use now: afterwards, like any other.
        let entries = &mut self.entries;
        self.held.retain(|k| {
            if k.0 != layer {
                return true;
            }
            if let Some(e) = entries.get_mut(k) {
                e.held = false;
            }
            false
        });
        self.policy.batch(layer);
    }

    /// Look `key` up (once per distinct expert of the batch). On a miss a slot of `slot_bytes`
    /// is taken for the caller to fill.
    pub fn lookup(&mut self, key: Key, slot_bytes: usize) -> Lookup {
        self.stats.lookups += 1;
        self.tick += 1;
        self.policy.touched(key, self.tick);
        if let Some(e) = self.entries.get_mut(&key) {
            e.batch = self.batch;
            self.stats.hits += 1;
            if e.prefetched {
                e.prefetched = false;
                self.stats.prefetch_hits += 1;
            }
            return Lookup::Hit;
        }
        // The buffer is taken when the slot is first used (after `make_room`).
        let buf = AlignedBuf::new(0);
        self.used += slot_bytes as u64;
        self.stats.miss_bytes += slot_bytes as u64;
        if self.ever_evicted.contains(&key) {
            self.stats.rereads += 1;
        }
        self.unfilled += slot_bytes as u64;
        self.entries.insert(
            key,
            Entry {
                buf,
                size: slot_bytes,
                batch: self.batch,
                filled: false,
                pinned: false,
                prefetched: false,
                held: false,
            },
        );
        Lookup::Miss
    }

    /// A repeat of `key` within the batch (no lookup): refresh its recency.
    pub fn touch(&mut self, key: Key) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.batch = self.batch;
            self.tick += 1;
            self.policy.touched(key, self.tick);
        }
    }

    /// Keep `key` (if cached) through the end of the current batch, as if the batch had used
    /// it, without a lookup or a use for the policy to count: an expert a later layer is
    /// predicted to route is not evicted before that layer comes. Returns whether it is cached.
    pub fn retain(&mut self, key: Key) -> bool {
        match self.entries.get_mut(&key) {
            Some(e) => {
                e.batch = self.batch;
                true
            }
            None => false,
        }
    }

    /// The slot of a cached expert.
    pub fn slot(&self, key: Key) -> Option<&[u8]> {
        self.entries.get(&key).map(|e| e.buf.as_slice())
    }

    /// The slot of a cached expert, to fill after a miss.
    pub fn slot_mut(&mut self, key: Key) -> Option<&mut [u8]> {
        self.fill_buf(key);
        self.entries.get_mut(&key).map(|e| e.buf.as_mut_slice())
    }

    /// Give a missed entry its buffer: a freed one of the size, or a new one.
    fn fill_buf(&mut self, key: Key) {
        let Some(e) = self.entries.get_mut(&key) else {
            return;
        };
        if e.filled {
            return;
        }
        e.filled = true;
        self.unfilled -= e.size as u64;
        let size = e.size;
        e.buf = match self.free.get_mut(&size).and_then(Vec::pop) {
            Some(b) => {
                self.pooled -= size as u64;
                b
            }
            None => {
                // A freed slot up to a quarter larger serves as well (a model whose layers
                // differ in one tensor's type has two slot sizes: Q4_K_M's ffn_down alternates
                // Q4_K and Q6_K); the entry then counts the buffer's whole size.
                let larger = (self.free.iter())
                    .filter(|&(&len, pool)| {
                        !pool.is_empty() && len > size && len - size <= size / 4
                    })
                    .map(|(&len, _)| len)
                    .min();
                if let Some(b) = larger.and_then(|len| self.free.get_mut(&len)?.pop()) {
                    let len = b.len();
                    self.pooled -= len as u64;
                    self.used += (len - size) as u64;
                    e.size = len;
                    e.buf = b;
                    return;
                }
                // Freed slots of other sizes go first where the new one would take the
                // memory past the budget (`size` is in `used`, no longer in `unfilled`).
                let budget = self.budget;
                let (filled, free, pooled) =
                    (self.used - self.unfilled, &mut self.free, &mut self.pooled);
                for pool in free.values_mut() {
                    while filled + *pooled > budget {
                        let Some(b) = pool.pop() else {
                            break;
                        };
                        *pooled -= b.len() as u64;
                    }
                }
                AlignedBuf::new(size)
            }
        };
    }

    /// Evict, before the batch's misses take their buffers, until the slots fit the budget —
    /// never an entry the batch has looked up or touched. Call it after every lookup of the
    /// batch: the evictions are then exactly those [`end_batch`](Self::end_batch) would make,
    /// but the memory is freed before the misses need it, so the cache stays within its
    /// budget unless one batch alone exceeds it.
    pub fn make_room(&mut self) {
        if self.budget > 0 {
            self.evict_to(self.budget);
        }
    }

    /// Evict entries the batch has not touched (nor pinned or held ones), in the policy's
    /// order, until the slots hold at most `limit` bytes or nothing more may leave.
    fn evict_to(&mut self, limit: u64) {
        while self.used > limit {
            let batch = self.batch;
            let entries = &self.entries;
            let victim = self.policy.victim(&|k| {
                entries
                    .get(&k)
                    .is_some_and(|e| e.batch != batch && !e.pinned && !e.held)
            });
            match victim {
                Some(k) => self.evict(k),
                None => break,
            }
        }
    }

    /// Evict, as [`make_room`](Self::make_room) does, until `bytes` more fit the budget; whether
    /// they do. A read ahead that asks first never takes the cache over its budget (with a
    /// budget of 0 nothing fits).
    pub fn room_for(&mut self, bytes: u64) -> bool {
        if self.budget == 0 || bytes > self.budget {
            return false;
        }
        self.evict_to(self.budget - bytes);
        self.used + bytes <= self.budget
    }

    /// Pin `key`: an entry of `slot_bytes` that is never evicted (its bytes count against the
    /// budget, so the other entries share what is left). Returns its buffer, lent out as by
    /// [`take_slot`](Self::take_slot), for the caller to fill and [`put_slot`](Self::put_slot)
    /// back; `None` when `key` is already cached or there is no cache (a budget of 0).
    pub fn pin(&mut self, key: Key, slot_bytes: usize) -> Option<AlignedBuf> {
        if self.budget == 0 || self.entries.contains_key(&key) {
            return None;
        }
        self.used += slot_bytes as u64;
        self.pinned_bytes += slot_bytes as u64;
        self.entries.insert(
            key,
            Entry {
                buf: AlignedBuf::new(0),
                size: slot_bytes,
                batch: 0,
                filled: true,
                pinned: true,
                prefetched: false,
                held: false,
            },
        );
        Some(AlignedBuf::new(slot_bytes))
    }

    /// Tell the policy of `count` uses of `key` before this run.
    pub fn history(&mut self, key: Key, count: u64) {
        self.policy.history(key, count);
    }

    /// Read `key` ahead of its lookup: an entry of `slot_bytes`, kept through the end of the
    /// current batch (then the policy decides like for any other), not counted as a lookup.
    /// Returns its buffer, lent out as by [`take_slot`](Self::take_slot); `None` when `key` is
    /// already cached or there is no cache.
    pub fn prefetch(&mut self, key: Key, slot_bytes: usize) -> Option<AlignedBuf> {
        if self.budget == 0 || self.entries.contains_key(&key) {
            return None;
        }
        self.tick += 1;
        self.policy.admitted(key, self.tick);
        self.used += slot_bytes as u64;
        self.unfilled += slot_bytes as u64;
        self.stats.prefetches += 1;
        self.stats.prefetch_bytes += slot_bytes as u64;
        self.entries.insert(
            key,
            Entry {
                buf: AlignedBuf::new(0),
                size: slot_bytes,
                batch: self.batch,
                filled: false,
                pinned: false,
                prefetched: true,
                held: false,
            },
        );
        // A freed buffer of the size when there is one.
        self.take_slot(key)
    }

    /// [`prefetch`](Self::prefetch) for an expert its layer will route for certain (a committed
    /// routing): the entry is not evicted before that layer's next batch begins.
    pub fn prefetch_held(&mut self, key: Key, slot_bytes: usize) -> Option<AlignedBuf> {
        let buf = self.prefetch(key, slot_bytes)?;
        if let Some(e) = self.entries.get_mut(&key) {
            e.held = true;
            self.held.push(key);
        }
        Some(buf)
    }

    /// Bytes of the pinned entries.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned_bytes
    }

    /// Lend out the slot buffer of `key` (to be filled on another thread); the entry stays,
    /// with an empty slot, until [`put_slot`](Self::put_slot) returns the buffer.
    pub fn take_slot(&mut self, key: Key) -> Option<AlignedBuf> {
        self.fill_buf(key);
        let e = self.entries.get_mut(&key)?;
        Some(std::mem::replace(&mut e.buf, AlignedBuf::new(0)))
    }

    /// Return a buffer [`take_slot`](Self::take_slot) lent out.
    pub fn put_slot(&mut self, key: Key, buf: AlignedBuf) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.buf = buf;
        }
    }

    /// Drop `key` without counting an eviction (its read failed: the slot holds no valid
    /// bytes).
    pub fn discard(&mut self, key: Key) {
        if let Some(e) = self.entries.remove(&key) {
            self.release(key, e);
        }
    }

    /// End the batch: evict until the slots fit the budget, never an entry this batch touched
    /// (with a budget of 0: free every slot).
    pub fn end_batch(&mut self) {
        if self.budget == 0 {
            let keys: Vec<Key> = self.entries.keys().copied().collect();
            for k in keys {
                self.evict(k);
            }
            return;
        }
        self.evict_to(self.budget);
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.used);
    }

    fn evict(&mut self, key: Key) {
        if let Some(e) = self.entries.remove(&key) {
            self.stats.evictions += 1;
            self.ever_evicted.insert(key);
            self.release(key, e);
        }
    }

    fn release(&mut self, key: Key, e: Entry) {
        self.policy.removed(key);
        self.used -= e.size as u64;
        if e.pinned {
            self.pinned_bytes -= e.size as u64;
        }
        if !e.filled {
            self.unfilled -= e.size as u64;
        }
        if e.buf.len() != e.size {
            // Lent out and never returned: nothing to recycle.
            return;
        }
        // A few freed slots per size are kept for the next misses (within the budget, or as
        // the staging area of a cache of 0); the rest go back to the allocator, so that memory
        // stays within the budget.
        let size = e.buf.len() as u64;
        let held = self.used - self.unfilled + self.pooled;
        let room = self.budget == 0 || held + size <= self.budget;
        let pool = self.free.entry(e.buf.len()).or_default();
        if (self.budget > 0 || pool.len() < FREE_SLOTS_KEPT) && room {
            pool.push(e.buf);
            self.pooled += size;
        }
    }

    /// Bytes held in slots now.
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    /// The budget.
    pub fn budget_bytes(&self) -> u64 {
        self.budget
    }

    /// Cached experts.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `key` is cached.
    pub fn contains(&self, key: Key) -> bool {
        self.entries.contains_key(&key)
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }
}

#[cfg(test)]
mod tests {
    use super::hit_pct;

    #[test]
    fn the_hit_rate_is_a_percentage_and_zero_without_lookups() {
        assert_eq!(hit_pct(0, 0), 0.0);
        assert_eq!(hit_pct(3, 4), 75.0);
        assert_eq!(hit_pct(7, 7), 100.0);
        assert_eq!(hit_pct(1, 3), 100.0 / 3.0);
    }
}
