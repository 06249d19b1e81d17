//! The acceptance figures: decode-only hit rates on a real Qwen3-30B-A3B trace, against the
//! replay BigMoeOnEdge published for the same trace
//! (`docs/bench-data/2026-07-20-cache-replay/qwen-curve.csv` in that project: `hit_pct_decode`
//! and, for both phases, `hit_pct_cum`; see tests/data/README.md).

use std::path::Path;

use telemetry::replay::{MIB, Workload};
use telemetry::{Phase, Policy, read_route_trace};

#[test]
fn qwen3_30b_a3b_matches_the_published_replay() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/qwen3-30b-a3b.route.csv");
    let t = read_route_trace(&path).unwrap();
    assert_eq!((t.n_layer, t.n_expert, t.n_expert_used), (48, 128, 6));
    let w = Workload::new(&t);
    // 28-token prompt: one prefill batch per layer; 128 decoded tokens x 48 layers.
    let prefill = w
        .batches()
        .iter()
        .filter(|b| b.phase == Phase::Prefill)
        .count();
    assert_eq!((prefill, w.batches().len() - prefill), (48, 6144));
    assert_eq!(t.decode_tokens(), 128);

    // (budget MiB, policy, published decode-only hit %, published both-phases hit %)
    let published = [
        (1000, Policy::Lru, 37.679, 35.141),
        (2000, Policy::Lru, 56.548, 52.740),
        (4000, Policy::Lru, 80.287, 74.880),
        (1000, Policy::Belady, 62.671, 58.450),
        (2000, Policy::Belady, 79.354, 74.010),
        (4000, Policy::Belady, 92.716, 86.472),
    ];
    for (mib, policy, decode, both) in published {
        let s = w.replay(policy, mib * MIB);
        let (got_decode, got_both) = (s.decode.hit_pct(), s.total().hit_pct());
        // The published figures have 3 decimals; the acceptance bound is 0.2 points.
        assert!(
            (got_decode - decode).abs() < 0.0015,
            "{mib} MiB {policy:?}: decode {got_decode:.3} vs {decode}"
        );
        assert!(
            (got_both - both).abs() < 0.0015,
            "{mib} MiB {policy:?}: both phases {got_both:.3} vs {both}"
        );
    }

    // Below one token cycle (784.7 MiB here) global LRU keeps nothing between tokens.
    assert!((t.token_cycle_bytes() as f64 / MIB as f64 - 784.7).abs() < 0.05);
    assert_eq!(w.replay(Policy::Lru, 500 * MIB).decode.hits, 0);
}
