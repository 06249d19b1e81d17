//! The streaming counters: what the expert source did, shared with the run loop
//! ([`StreamCounters`], read as [`StreamSnapshot`]s), and what the last layer batch found, shared
//! with a route trace ([`BatchView`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters shared with the run loop (the source itself moves into the engine). All are
/// cumulative; a token's values are the difference of two [`snapshot`](Self::snapshot)s.
#[derive(Debug, Default)]
pub struct StreamCounters {
    /// Bytes read from the files (whole aligned windows).
    pub read_bytes: AtomicU64,
    /// Serial: wall time compute waited for reads. Overlap: the lanes' summed busy time.
    pub io_ns: AtomicU64,
    /// Overlap: wall time compute waited for a read (one thread waits, so the union of the
    /// stalled intervals is their sum).
    pub stall_ns: AtomicU64,
    /// Cache bookkeeping: lookups, issuing reads, collecting them, eviction.
    pub mgmt_ns: AtomicU64,
    /// Distinct experts looked up, and how many were in the cache.
    pub lookups: AtomicU64,
    pub hits: AtomicU64,
    pub evictions: AtomicU64,
    /// Misses of experts the cache had held before.
    pub rereads: AtomicU64,
    /// Bytes of the distinct routed experts (what the routing asked for, hit or miss).
    pub demand_bytes: AtomicU64,
    /// The most bytes one layer's batch routed.
    pub layer_demand_max: AtomicU64,
    /// Routed (token, expert) slots.
    pub routed: AtomicU64,
    /// Bytes held in cache slots after the last batch.
    pub resident_bytes: AtomicU64,
    /// Experts read ahead (co-activation prefetch), their bytes, and lookups that hit them.
    pub prefetches: AtomicU64,
    pub prefetch_bytes: AtomicU64,
    pub prefetch_hits: AtomicU64,
    /// Experts a prompt batch read ahead for the next MoE layer, their bytes, and lookups that
    /// hit them (apart from the `prefetch` counters, which are the readers ahead of decoding).
    pub prompt_ahead: AtomicU64,
    pub prompt_ahead_bytes: AtomicU64,
    pub prompt_ahead_hits: AtomicU64,
}

/// The counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamSnapshot {
    pub read_bytes: u64,
    pub io_ns: u64,
    pub stall_ns: u64,
    pub mgmt_ns: u64,
    pub lookups: u64,
    pub hits: u64,
    pub evictions: u64,
    pub rereads: u64,
    pub demand_bytes: u64,
    pub layer_demand_max: u64,
    pub routed: u64,
    pub resident_bytes: u64,
    pub prefetches: u64,
    pub prefetch_bytes: u64,
    pub prefetch_hits: u64,
    pub prompt_ahead: u64,
    pub prompt_ahead_bytes: u64,
    pub prompt_ahead_hits: u64,
}

impl StreamSnapshot {
    /// What happened between `earlier` and `self` (the two gauges, `layer_demand_max` and
    /// `resident_bytes`, are `self`'s).
    pub fn since(&self, earlier: &StreamSnapshot) -> StreamSnapshot {
        StreamSnapshot {
            read_bytes: self.read_bytes - earlier.read_bytes,
            io_ns: self.io_ns - earlier.io_ns,
            stall_ns: self.stall_ns - earlier.stall_ns,
            mgmt_ns: self.mgmt_ns - earlier.mgmt_ns,
            lookups: self.lookups - earlier.lookups,
            hits: self.hits - earlier.hits,
            evictions: self.evictions - earlier.evictions,
            rereads: self.rereads - earlier.rereads,
            demand_bytes: self.demand_bytes - earlier.demand_bytes,
            layer_demand_max: self.layer_demand_max,
            routed: self.routed - earlier.routed,
            resident_bytes: self.resident_bytes,
            prefetches: self.prefetches - earlier.prefetches,
            prefetch_bytes: self.prefetch_bytes - earlier.prefetch_bytes,
            prefetch_hits: self.prefetch_hits - earlier.prefetch_hits,
            prompt_ahead: self.prompt_ahead - earlier.prompt_ahead,
            prompt_ahead_bytes: self.prompt_ahead_bytes - earlier.prompt_ahead_bytes,
            prompt_ahead_hits: self.prompt_ahead_hits - earlier.prompt_ahead_hits,
        }
    }

    /// Hits per lookup in percent (0 without lookups).
    pub fn hit_pct(&self) -> f64 {
        store::cache::hit_pct(self.hits, self.lookups)
    }
}

impl StreamCounters {
    /// The counters now.
    pub fn snapshot(&self) -> StreamSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StreamSnapshot {
            read_bytes: l(&self.read_bytes),
            io_ns: l(&self.io_ns),
            stall_ns: l(&self.stall_ns),
            mgmt_ns: l(&self.mgmt_ns),
            lookups: l(&self.lookups),
            hits: l(&self.hits),
            evictions: l(&self.evictions),
            rereads: l(&self.rereads),
            demand_bytes: l(&self.demand_bytes),
            layer_demand_max: l(&self.layer_demand_max),
            routed: l(&self.routed),
            resident_bytes: l(&self.resident_bytes),
            prefetches: l(&self.prefetches),
            prefetch_bytes: l(&self.prefetch_bytes),
            prefetch_hits: l(&self.prefetch_hits),
            prompt_ahead: l(&self.prompt_ahead),
            prompt_ahead_bytes: l(&self.prompt_ahead_bytes),
            prompt_ahead_hits: l(&self.prompt_ahead_hits),
        }
    }

    /// Adds `v` to the counter `a`.
    pub(super) fn add(a: &AtomicU64, v: u64) {
        a.fetch_add(v, Ordering::Relaxed);
    }
}

/// What the last layer batch found: per distinct routed expert, its residency (the route
/// trace's: 0 a miss, 1 a hit, 2 a hit on an expert read ahead, at its first lookup since), and
/// the bytes its read pulls (0 for a hit). Shared with a route trace.
#[derive(Debug, Default)]
pub struct BatchView {
    pub layer: u32,
    pub entries: Vec<(u32, u8, u64)>,
}

impl BatchView {
    /// (residency, bytes read) of `expert` in the batch.
    pub fn get(&self, expert: u32) -> Option<(u8, u64)> {
        self.entries
            .iter()
            .find(|e| e.0 == expert)
            .map(|&(_, residency, bytes)| (residency, bytes))
    }
}
