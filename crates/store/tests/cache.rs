//! The expert cache: its bookkeeping, and its hit rate on a real routing trace equal to the
//! offline replay's (which reproduces BigMoeOnEdge's published figures).

use std::path::Path;

use store::{ExpertCache, Lookup, Lru};

#[test]
fn hits_misses_and_eviction_after_the_batch() {
    // Budget for two 4096-byte slots.
    let mut c = ExpertCache::new(2 * 4096, Lru::default());
    c.begin_batch(0);
    assert_eq!(c.lookup((0, 1), 4096), Lookup::Miss);
    c.slot_mut((0, 1)).unwrap().fill(7);
    assert_eq!(c.lookup((0, 2), 4096), Lookup::Miss);
    assert_eq!(c.lookup((0, 3), 4096), Lookup::Miss);
    // Over budget, but every entry is this batch's: nothing is evicted.
    c.end_batch();
    assert_eq!((c.len(), c.used_bytes()), (3, 3 * 4096));
    c.begin_batch(0);
    assert_eq!(c.lookup((1, 9), 4096), Lookup::Miss);
    assert_eq!(c.lookup((0, 1), 4096), Lookup::Hit);
    assert!(c.slot((0, 1)).unwrap().iter().all(|&b| b == 7));
    c.end_batch();
    // The two least recently used untouched entries left: (0,2), (0,3).
    assert!(c.contains((0, 1)) && c.contains((1, 9)));
    assert!(!c.contains((0, 2)) && !c.contains((0, 3)));
    c.begin_batch(0);
    assert_eq!(c.lookup((0, 2), 4096), Lookup::Miss);
    c.end_batch();
    let s = c.stats();
    assert_eq!((s.lookups, s.hits, s.evictions, s.rereads), (6, 1, 3, 1));
    assert_eq!(s.miss_bytes, 5 * 4096);
    // Slots are aligned for O_DIRECT reads.
    assert_eq!(
        c.slot_mut((0, 2)).unwrap().as_ptr() as usize % store::cache::SLOT_ALIGN,
        0
    );
}

/// `make_room` evicts before the misses take buffers: the cache never holds more than its
/// budget, and the misses reuse the evicted experts' buffers.
#[test]
fn room_is_made_before_the_misses_take_buffers() {
    let mut c = ExpertCache::new(2 * 4096, Lru::default());
    c.begin_batch(0);
    for e in [1, 2] {
        assert_eq!(c.lookup((0, e), 4096), Lookup::Miss);
    }
    c.make_room();
    for e in [1, 2] {
        let buf = c.take_slot((0, e)).unwrap();
        c.put_slot((0, e), buf);
    }
    let kept: Vec<usize> = [1, 2]
        .iter()
        .map(|&e| c.slot((0, e)).unwrap().as_ptr() as usize)
        .collect();
    c.end_batch();
    c.begin_batch(0);
    assert_eq!(c.lookup((0, 1), 4096), Lookup::Hit);
    assert_eq!(c.lookup((0, 3), 4096), Lookup::Miss);
    assert_eq!(c.used_bytes(), 3 * 4096);
    c.make_room();
    // (0,2) left; (0,1) is in use by this batch.
    assert!(!c.contains((0, 2)) && c.contains((0, 1)));
    assert_eq!(c.used_bytes(), 2 * 4096);
    let reused = c.slot_mut((0, 3)).unwrap().as_ptr() as usize;
    assert_eq!(
        reused, kept[1],
        "the miss takes the evicted expert's buffer"
    );
    c.end_batch();
    assert_eq!(c.stats().evictions, 1);
}

#[test]
fn a_zero_budget_is_a_staging_area() {
    let mut c = ExpertCache::new(0, Lru::default());
    for _ in 0..3 {
        c.begin_batch(0);
        assert_eq!(c.lookup((0, 1), 8192), Lookup::Miss);
        c.touch((0, 1));
        assert!(c.slot((0, 1)).is_some());
        c.end_batch();
        assert!(c.is_empty());
    }
    assert_eq!(c.stats().hits, 0);
}

/// Every size of the test is divided by this (the trace's expert sizes and the budgets are
/// multiples of it), so that the decisions are the same with 4096 times less memory.
const SCALE: u64 = 4096;

/// Drive the cache with the real Qwen3-30B-A3B trace, batch by batch as the engine will.
fn cache_hit_pct(trace: &telemetry::RouteTrace, budget: u64) -> (f64, u64) {
    let mut c = ExpertCache::new(budget / SCALE, Lru::default());
    let (mut lookups, mut hits) = (0u64, 0u64);
    for b in telemetry::batches(trace) {
        let bytes = trace.expert_bytes(b.layer);
        assert_eq!(bytes % SCALE, 0);
        let size = (bytes / SCALE) as usize;
        c.begin_batch(b.layer);
        let before = c.stats();
        let mut seen = vec![false; b.experts.len()];
        for &j in &b.uses {
            let key = (b.layer, b.experts[j]);
            if seen[j] {
                c.touch(key);
            } else {
                seen[j] = true;
                c.lookup(key, size);
            }
        }
        c.end_batch();
        if b.phase == telemetry::Phase::Decode {
            let after = c.stats();
            lookups += after.lookups - before.lookups;
            hits += after.hits - before.hits;
        }
    }
    (
        100.0 * hits as f64 / lookups as f64,
        c.stats().miss_bytes * SCALE,
    )
}

#[test]
fn the_cache_hits_exactly_what_the_offline_replay_predicts() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../telemetry/tests/data/qwen3-30b-a3b.route.csv");
    let t = telemetry::read_route_trace(&path).unwrap();
    let w = telemetry::Workload::new(&t);
    for mib in [1000u64, 2000, 4000] {
        let budget = mib << 20;
        let replay = w.replay(telemetry::Policy::Lru, budget);
        let (pct, miss_bytes) = cache_hit_pct(&t, budget);
        assert_eq!(pct, replay.decode.hit_pct(), "{mib} MiB");
        assert_eq!(
            miss_bytes,
            replay.decode.miss_bytes + replay.prefill.miss_bytes,
            "{mib} MiB"
        );
    }
}

#[test]
fn a_lent_slot_comes_back_filled_and_counts_all_along() {
    let mut c = ExpertCache::new(4096, Lru::default());
    c.begin_batch(0);
    assert_eq!(c.lookup((3, 4), 4096), Lookup::Miss);
    let mut buf = c.take_slot((3, 4)).unwrap();
    // Lent out: the entry still counts against the budget.
    assert_eq!((c.used_bytes(), c.slot((3, 4)).unwrap().len()), (4096, 0));
    buf.as_mut_slice().fill(9);
    c.put_slot((3, 4), buf);
    assert!(c.slot((3, 4)).unwrap().iter().all(|&b| b == 9));
    c.end_batch();
    // A lent slot that is dropped (its read failed) frees its bytes too.
    c.begin_batch(0);
    assert_eq!(c.lookup((3, 5), 4096), Lookup::Miss);
    let _lost = c.take_slot((3, 5)).unwrap();
    c.discard((3, 5));
    c.end_batch();
    assert_eq!(c.used_bytes(), 4096);
    assert!(c.contains((3, 4)) && !c.contains((3, 5)));
}

/// A pinned expert is never evicted, hits from its first lookup, and its bytes come out of the
/// budget the other entries share; there is nothing to pin without a cache.
#[test]
fn pinned_entries_stay_and_share_the_budget() {
    let mut c = ExpertCache::new(3 * 4096, Lru::default());
    let mut buf = c.pin((0, 5), 4096).unwrap();
    buf.as_mut_slice().fill(3);
    c.put_slot((0, 5), buf);
    assert!(c.pin((0, 5), 4096).is_none(), "pinned once");
    assert_eq!((c.pinned_bytes(), c.used_bytes()), (4096, 4096));
    // Batches of other experts: LRU would take (0,5) first, the oldest; only the two
    // unpinned slots turn over.
    for e in 0..4u32 {
        c.begin_batch(0);
        assert_eq!(c.lookup((1, e), 4096), Lookup::Miss);
        c.end_batch();
        assert!(c.contains((0, 5)));
        assert!(c.used_bytes() <= 3 * 4096);
    }
    assert_eq!(c.len(), 3);
    c.begin_batch(0);
    assert_eq!(c.lookup((0, 5), 4096), Lookup::Hit);
    c.end_batch();
    assert!(c.slot((0, 5)).unwrap().iter().all(|&b| b == 3));
    // A discarded pin (its read failed) frees its bytes.
    c.discard((0, 5));
    assert_eq!(c.pinned_bytes(), 0);
    assert!(
        ExpertCache::new(0, Lru::default())
            .pin((0, 1), 4096)
            .is_none()
    );
}

/// An expert read ahead is no lookup; it stays through the batch it was read in, its first
/// lookup is a hit counted as a prefetch hit, and an unused one is evicted like any other.
#[test]
fn prefetched_entries_hit_once_looked_up_and_count_apart() {
    let mut c = ExpertCache::new(2 * 4096, Lru::default());
    c.begin_batch(0);
    assert_eq!(c.lookup((0, 1), 4096), Lookup::Miss);
    c.slot_mut((0, 1)).unwrap().fill(1);
    // Read ahead two experts of layer 1: over budget until the batch ends, and kept then.
    for e in [5u32, 6] {
        let mut buf = c.prefetch((1, e), 4096).unwrap();
        buf.as_mut_slice().fill(e as u8);
        c.put_slot((1, e), buf);
    }
    assert!(c.prefetch((1, 5), 4096).is_none(), "already cached");
    c.end_batch();
    assert!(c.contains((1, 5)) && c.contains((1, 6)));
    let s = c.stats();
    assert_eq!(
        (s.lookups, s.prefetches, s.prefetch_bytes),
        (1, 2, 2 * 4096)
    );
    c.begin_batch(1);
    assert_eq!(c.lookup((1, 5), 4096), Lookup::Hit);
    assert!(c.slot((1, 5)).unwrap().iter().all(|&b| b == 5));
    c.end_batch();
    // Over budget: the least recent untouched entry, (0,1), leaves (under LRU a read ahead
    // is a use at the time it was read).
    assert!(!c.contains((0, 1)) && c.contains((1, 5)) && c.contains((1, 6)));
    assert_eq!(c.used_bytes(), 2 * 4096);
    let s = c.stats();
    assert_eq!((s.hits, s.prefetch_hits), (1, 1));
    // A second lookup of a prefetched entry is a plain hit.
    c.begin_batch(1);
    assert_eq!(c.lookup((1, 5), 4096), Lookup::Hit);
    c.end_batch();
    assert_eq!(c.stats().prefetch_hits, 1);
    assert!(
        ExpertCache::new(0, Lru::default())
            .prefetch((0, 1), 4096)
            .is_none()
    );
}

/// `room_for` evicts what a batch has not touched until the bytes fit, and says no when the
/// batch's own and the held entries leave no room.
#[test]
fn room_for_evicts_untouched_entries_until_the_bytes_fit_the_budget() {
    let mut c = ExpertCache::new(4 * 4096, Lru::default());
    c.begin_batch(0);
    for e in [1u32, 2] {
        assert_eq!(c.lookup((0, e), 4096), Lookup::Miss);
    }
    c.end_batch();
    c.begin_batch(1);
    assert_eq!(c.lookup((1, 7), 4096), Lookup::Miss);
    // One slot is free: nothing leaves.
    assert!(c.room_for(4096));
    assert_eq!((c.len(), c.stats().evictions), (3, 0));
    // Two slots: the least recent untouched entry, (0,1), leaves.
    assert!(c.room_for(2 * 4096));
    assert!(!c.contains((0, 1)) && c.contains((0, 2)) && c.contains((1, 7)));
    // Read ahead into the room, held for layer 2: then only (0,2) may leave.
    let buf = c.prefetch_held((2, 3), 4096).unwrap();
    c.put_slot((2, 3), buf);
    assert!(c.room_for(2 * 4096));
    assert!(!c.contains((0, 2)));
    // The batch's (1,7) and the held (2,3) fill two of four slots: three more do not fit.
    assert!(!c.room_for(3 * 4096));
    assert!(c.contains((1, 7)) && c.contains((2, 3)));
    assert_eq!(c.used_bytes(), 2 * 4096);
    assert!(!c.room_for(5 * 4096), "more than the budget");
    assert!(!ExpertCache::new(0, Lru::default()).room_for(1));
}

/// A freed slot is used again by the next miss of its size, or of a size at most a quarter
/// smaller (which then counts the whole buffer): the buffer is the same memory, no new one.
#[test]
fn freed_slots_serve_the_next_misses_up_to_a_quarter_larger() {
    let (small, large) = (4096usize, 4608usize);
    let mut c = ExpertCache::new(2 * large as u64, Lru::default());
    c.begin_batch(0);
    for e in [1u32, 2] {
        assert_eq!(c.lookup((0, e), large), Lookup::Miss);
    }
    let old: Vec<usize> = [1u32, 2]
        .iter()
        .map(|&e| c.slot_mut((0, e)).unwrap().as_ptr() as usize)
        .collect();
    c.end_batch();
    c.begin_batch(1);
    for e in [1u32, 2] {
        assert_eq!(c.lookup((1, e), small), Lookup::Miss);
    }
    c.make_room();
    for e in [1u32, 2] {
        let slot = c.slot_mut((1, e)).unwrap();
        assert_eq!(slot.len(), large, "the larger freed slot");
        assert!(old.contains(&(slot.as_ptr() as usize)), "a new buffer");
    }
    assert_eq!(
        c.used_bytes(),
        2 * large as u64,
        "counted at the buffer's size"
    );
    c.end_batch();
    // a slot more than a quarter larger does not serve: a new buffer of the size
    let mut c = ExpertCache::new(2 * 8192, Lru::default());
    c.begin_batch(0);
    c.lookup((0, 1), 8192);
    c.slot_mut((0, 1)).unwrap();
    c.lookup((0, 2), 8192);
    c.slot_mut((0, 2)).unwrap();
    c.end_batch();
    c.begin_batch(1);
    c.lookup((1, 1), small);
    c.make_room();
    assert_eq!(c.slot_mut((1, 1)).unwrap().len(), small);
    assert!(c.used_bytes() <= 2 * 8192);
}

/// Hits of a cache of `slots` 4096-byte slots under `policy`, for batches of one layer each
/// routing the experts given.
fn hits_of<P: store::EvictionPolicy>(policy: P, slots: u64, batches: &[(u32, Vec<u32>)]) -> u64 {
    let mut c = ExpertCache::new(slots * 4096, policy);
    for (layer, experts) in batches {
        c.begin_batch(*layer);
        for &e in experts {
            c.lookup((*layer, e), 4096);
        }
        c.make_room();
        c.end_batch();
    }
    c.stats().hits
}

#[test]
fn the_adaptive_policy_follows_whichever_of_forecast_and_lru_hits_more() {
    use store::{Adaptive, Forecast};
    // A cycle of three layers, one expert each, in a cache of two: LRU evicts exactly what
    // comes next and hits nothing; forecast keeps two of the three.
    let cycle: Vec<(u32, Vec<u32>)> = (0..60).map(|i| (i % 3, vec![1])).collect();
    let lru = hits_of(Lru::default(), 2, &cycle);
    let fc = hits_of(Forecast::new(&[0, 1, 2], 1, 8), 2, &cycle);
    let ad = hits_of(Adaptive::new(&[0, 1, 2], 1, 8), 2, &cycle);
    assert_eq!(lru, 0);
    assert!(fc > 0 && ad >= fc, "forecast {fc}, adaptive {ad}");
    // One layer, a cache of two: an expert used in each of the first 40 batches goes cold
    // while two others take turns. A frequency learned from the whole past keeps the cold one
    // and makes the two evict each other; LRU lets it go.
    let mut turns: Vec<(u32, Vec<u32>)> = (0..40).map(|_| (0, vec![0])).collect();
    turns.extend((0..60).map(|i| (0, vec![1 + i % 2])));
    let lru = hits_of(Lru::default(), 2, &turns);
    let fc = hits_of(Forecast::new(&[0], 1, 8), 2, &turns);
    let ad = hits_of(Adaptive::new(&[0], 1, 8), 2, &turns);
    assert!(lru > fc, "lru {lru}, forecast {fc}");
    assert!(ad > fc, "lru {lru}, forecast {fc}, adaptive {ad}");
}
