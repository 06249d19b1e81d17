//! What the runtime's tests share: the generated MoE test models and a quiet, greedy setup.

use std::path::PathBuf;

use runtime::open::{RunConfig, Sampling};

/// A model of `scripts/fetch_moe_fixtures.sh`.
pub fn moe(name: &str) -> PathBuf {
    let p = testdata::fixtures_root().join("moe").join(name);
    assert!(
        p.is_file(),
        "{} missing: run `bash scripts/fetch_moe_fixtures.sh`",
        p.display()
    );
    p
}

/// Greedy, two threads, no usage history (the tests must not write next to the fixtures).
pub fn config(model: PathBuf) -> RunConfig {
    let mut cfg = RunConfig::new(model);
    cfg.threads = Some(2);
    cfg.sampling = Sampling {
        temp: 0.0,
        seed: 1,
        ..Sampling::default()
    };
    cfg.history.no_usage = true;
    cfg
}
