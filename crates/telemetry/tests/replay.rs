//! Replay tests on tiny synthetic traces whose results are worked out by hand in the comments.
//!
//! Every expert is 1 MiB unless a test says otherwise, so a capacity of N MiB holds N experts.

use telemetry::replay::{MIB, Workload, batches};
use telemetry::{Phase, Policy, RouteTrace, replay};

/// A one-layer trace (1 MiB experts) from `(phase, step, experts)` cells, written as rows.
fn trace(n_expert_used: u32, cells: &[(u8, i64, &[u32])]) -> RouteTrace {
    let mut text = format!(
        "# route_trace v1\n# model=m arch=a n_layer=1 n_expert=16 n_expert_used={n_expert_used}\n\
         # layer=0 expert_bytes={MIB} dense_bytes=0\nturn,phase,step,layer,slot,expert\n"
    );
    for (phase, step, experts) in cells {
        for (slot, e) in experts.iter().enumerate() {
            text.push_str(&format!("0,{phase},{step},0,{slot},{e}\n"));
        }
    }
    RouteTrace::parse(&text, "synthetic").unwrap()
}

/// Decode cells 0, 1, 2, ... each routing one expert.
fn sequence(experts: &[u32]) -> RouteTrace {
    let cells: Vec<(u8, i64, Vec<u32>)> = experts
        .iter()
        .enumerate()
        .map(|(i, &e)| (1, i as i64, vec![e]))
        .collect();
    let refs: Vec<(u8, i64, &[u32])> = cells
        .iter()
        .map(|(p, s, e)| (*p, *s, e.as_slice()))
        .collect();
    trace(1, &refs)
}

#[test]
fn cyclic_pattern_defeats_lru_but_not_belady() {
    // A B C A B C A B C through a 2-entry cache.
    // LRU: every access evicts exactly the entry needed next -> 9 misses, 0 hits.
    // Bélády: A, B miss; C miss, evict B (next use 5, farther than A's 4) -> {A, C};
    //   A hit; B miss, evict A (7, farther than C's 6) -> {C, B}; C hit;
    //   A miss, evict C (9, farther than B's 8) -> {B, A}; B hit; C miss.
    //   3 hits of 9.
    let t = sequence(&[0, 1, 2, 0, 1, 2, 0, 1, 2]);
    let lru = replay(&t, Policy::Lru, 2 * MIB);
    assert_eq!((lru.decode.hits, lru.decode.lookups), (0, 9));
    assert_eq!(lru.decode.miss_bytes, 9 * MIB);
    let opt = replay(&t, Policy::Belady, 2 * MIB);
    assert_eq!((opt.decode.hits, opt.decode.lookups), (3, 9));
    assert!((opt.decode.hit_pct() - 100.0 / 3.0).abs() < 1e-9);
    // With room for all three, both miss only the first time: 6 hits of 9.
    for p in [Policy::Lru, Policy::Belady] {
        let s = replay(&t, p, 3 * MIB);
        assert_eq!((s.decode.hits, s.decode.lookups), (6, 9), "{p:?}");
    }
}

#[test]
fn lru_keeps_the_recent_entry_belady_the_soon_needed_one() {
    // A B A C B through a 2-entry cache.
    // LRU: A, B miss; A hit; C miss, evict B (least recent) -> {A, C}; B miss. 1 hit.
    // Bélády: A, B miss; A hit; C miss, evict A (never used again) -> {B, C}; B hit. 2 hits.
    let t = sequence(&[0, 1, 0, 2, 1]);
    assert_eq!(replay(&t, Policy::Lru, 2 * MIB).decode.hits, 1);
    assert_eq!(replay(&t, Policy::Belady, 2 * MIB).decode.hits, 2);
}

#[test]
fn eviction_never_takes_what_the_batch_touched() {
    // Capacity 2 experts, top-3.
    // Step 0 routes {0,1,2}: 3 misses; 3 MiB > 2 MiB, but all three were touched: nothing goes.
    // Step 1 routes {0,3,4}: 0 hits, 3 and 4 miss -> 5 MiB; evict untouched 1 then 2 -> 3 MiB,
    //   the rest is this batch's. Resident after each batch: 3, 3 MiB.
    // Step 2 routes {1}: miss (it was evicted) -> 1 hit of 7 in all.
    let t = trace(3, &[(1, 0, &[0, 1, 2]), (1, 1, &[0, 3, 4]), (1, 2, &[1])]);
    for p in [Policy::Lru, Policy::Belady] {
        let s = replay(&t, p, 2 * MIB);
        assert_eq!((s.decode.hits, s.decode.lookups), (1, 7), "{p:?}");
        assert_eq!(s.peak_resident_bytes, 3 * MIB, "{p:?}");
    }
}

#[test]
fn prefill_is_one_batch_per_layer_and_excluded_from_decode_hits() {
    // Prefill of 3 tokens routing {0,1}, {1,2}, {0,2}: one batch, 3 distinct experts, 3 misses
    // (not 6), 3 MiB read. Decode token 3 routes {0,1}: both hits.
    // Decode hit 2/2 = 100 %, prefill 0/3, both phases 2/5 = 40 %.
    let t = trace(
        2,
        &[
            (0, 0, &[0, 1]),
            (0, 1, &[1, 2]),
            (0, 2, &[0, 2]),
            (1, 3, &[0, 1]),
        ],
    );
    let b = batches(&t);
    assert_eq!(b.len(), 2);
    assert_eq!(b[0].phase, Phase::Prefill);
    assert_eq!(b[0].experts, vec![0, 1, 2]);
    assert_eq!(b[0].first_line, 5);
    for p in [Policy::Lru, Policy::Belady] {
        let s = replay(&t, p, 4 * MIB);
        assert_eq!((s.prefill.hits, s.prefill.lookups), (0, 3));
        assert_eq!(s.prefill.miss_bytes, 3 * MIB);
        assert_eq!((s.decode.hits, s.decode.lookups), (2, 2));
        assert_eq!(s.decode.hit_pct(), 100.0);
        assert_eq!(s.total().hit_pct(), 40.0);
        assert_eq!(s.decode_tokens, 1);
        assert_eq!(s.decode_miss_mib_per_token(), 0.0);
    }
}

#[test]
fn a_repeat_inside_a_prefill_batch_refreshes_lru_recency() {
    // Capacity 2. Prefill rows route 0, 1 (token 0) then 2, 0 (token 1): one batch, lookups
    // 0, 1, 2 (3 MiB, all kept: all touched), and the repeat of 0 makes it the most recent.
    // Decode token 2 routes {3}: miss -> 4 MiB; evict the least recent untouched: 1, then 2.
    // Decode token 3 routes {0}: a hit, because the repeat moved 0 past 1 and 2.
    // (Counting only first appearances, 0 would be least recent, evicted, and this a miss.)
    let t = trace(
        2,
        &[(0, 0, &[0, 1]), (0, 1, &[2, 0]), (1, 2, &[3]), (1, 3, &[0])],
    );
    let s = replay(&t, Policy::Lru, 2 * MIB);
    assert_eq!((s.decode.hits, s.decode.lookups), (1, 2));
}

#[test]
fn decode_batches_split_on_step_and_layer_and_sizes_come_from_the_preamble() {
    // Layer 0 experts are 1 MiB, layer 1 experts 3 MiB; expert 0 of layer 0 and expert 0 of
    // layer 1 are different entries. Two tokens each route expert 0 in both layers.
    // Capacity 4 MiB holds both: token 0 misses both (4 MiB), token 1 hits both.
    // Decode: 2 hits of 4 = 50 %, 4 MiB over 2 tokens = 2 MiB/token.
    let text = format!(
        "# route_trace v1\n# model=m arch=a n_layer=2 n_expert=4 n_expert_used=1\n\
         # layer=0 expert_bytes={} dense_bytes=0\n# layer=1 expert_bytes={} dense_bytes=0\n\
         turn,phase,step,layer,slot,expert\n0,1,5,0,0,0\n0,1,5,1,0,0\n0,1,6,0,0,0\n0,1,6,1,0,0\n",
        MIB,
        3 * MIB
    );
    let t = RouteTrace::parse(&text, "two-layer").unwrap();
    assert_eq!(batches(&t).len(), 4);
    let s = replay(&t, Policy::Lru, 4 * MIB);
    assert_eq!((s.decode.hits, s.decode.lookups), (2, 4));
    assert_eq!(s.decode.miss_bytes, 4 * MIB);
    assert_eq!(s.decode_miss_mib_per_token(), 2.0);
    // 3 MiB cannot hold both: each layer's visit evicts the other layer's entry.
    let s = replay(&t, Policy::Lru, 3 * MIB);
    assert_eq!(s.decode.hits, 0);
}

#[test]
fn belady_evicts_farthest_next_use_regardless_of_size() {
    // Layer 0 experts 1 MiB, layer 1 experts 2 MiB, capacity 3 MiB, one routing per cell.
    // Order: L1e0, L0e0, L0e1, L0e0, L1e0.
    //  L1e0 miss (2), L0e0 miss (3), L0e1 miss (4 > 3): untouched are L1e0 (next: 5th access)
    //  and L0e0 (next: 4th) -> evict L1e0 -> 2 MiB. L0e0 hit. L1e0 miss. 1 hit of 5.
    let text = format!(
        "# route_trace v1\n# model=m arch=a n_layer=2 n_expert=4 n_expert_used=1\n\
         # layer=0 expert_bytes={} dense_bytes=0\n# layer=1 expert_bytes={} dense_bytes=0\n\
         turn,phase,step,layer,slot,expert\n0,1,0,1,0,0\n0,1,0,0,0,0\n0,1,1,0,0,1\n0,1,2,0,0,0\n0,1,2,1,0,0\n",
        MIB,
        2 * MIB
    );
    let t = RouteTrace::parse(&text, "sizes").unwrap();
    let s = replay(&t, Policy::Belady, 3 * MIB);
    assert_eq!((s.decode.hits, s.decode.lookups), (1, 5));
    assert_eq!(s.decode.miss_bytes, 6 * MIB);
}

#[test]
fn a_workload_replays_many_budgets_with_the_same_answers() {
    let t = sequence(&[0, 1, 2, 0, 3, 1, 2, 0, 1, 3, 2, 0]);
    let w = Workload::new(&t);
    for mib in 1..5 {
        for p in [Policy::Lru, Policy::Belady] {
            assert_eq!(w.replay(p, mib * MIB), replay(&t, p, mib * MIB));
        }
    }
    // More room never hurts either policy on this trace, and Bélády is never below LRU.
    let hits = |p, mib| w.replay(p, mib * MIB).decode.hits;
    for mib in 1..4 {
        assert!(hits(Policy::Lru, mib) <= hits(Policy::Lru, mib + 1));
        assert!(hits(Policy::Belady, mib) <= hits(Policy::Belady, mib + 1));
        assert!(hits(Policy::Lru, mib) <= hits(Policy::Belady, mib));
    }
}

#[test]
fn policy_names_round_trip() {
    for p in [Policy::Lru, Policy::Belady] {
        assert_eq!(Policy::from_name(p.name()), Some(p));
    }
    assert_eq!(Policy::from_name("Bélády"), Some(Policy::Belady));
    assert_eq!(Policy::from_name("lfu"), None);
}
