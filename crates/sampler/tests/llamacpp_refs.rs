//! The sampler against llama.cpp: tests/fixtures/sampler_refs.json holds the ids llama.cpp's
//! default chain drew (and the candidate orders its single stages left) for logit rows that
//! this test regenerates with the same deterministic generator (see tests/fixtures/README.md).

use sampler::{Candidates, Sampler, SamplerParams};
use serde_json::Value;

/// splitmix64, the logit generator shared with scripts/gen_sampler_refs.c.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn rnd(&mut self, n: u32) -> u32 {
        (self.next_u64() % u64::from(n)) as u32
    }

    fn normal_int(&mut self) -> i32 {
        (0..4).map(|_| self.rnd(1 << 22) as i32 - (1 << 21)).sum()
    }

    /// One logit row of `kind` (0 normal, 1 peaked, 2 ties, 3 flat, 4 masked, 5 wide).
    fn logits(&mut self, n: usize, kind: u64) -> Vec<f32> {
        let scale = |s: i32, e: i32| s as f32 * 2f32.powi(e);
        match kind {
            0 => (0..n).map(|_| scale(self.normal_int(), -20)).collect(),
            1 => {
                let mut v: Vec<f32> = (0..n).map(|_| scale(self.normal_int(), -20)).collect();
                let j = self.rnd(n as u32) as usize;
                v[j] = 12.0 + self.rnd(8) as f32;
                v
            }
            2 => (0..n)
                .map(|_| (self.rnd(16) as i32 - 8) as f32 * 0.5)
                .collect(),
            3 => vec![1.0; n],
            4 => (0..n)
                .map(|_| {
                    let x = scale(self.normal_int(), -20);
                    if self.rnd(4) == 0 {
                        f32::NEG_INFINITY
                    } else {
                        x
                    }
                })
                .collect(),
            _ => (0..n).map(|_| scale(self.normal_int(), -17)).collect(),
        }
    }
}

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/sampler_refs.json"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["tool"].as_str().unwrap().contains("llama.cpp"));
    v
}

fn f32_of(v: &Value) -> f32 {
    v.as_f64().unwrap() as f32
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap()
}

fn fnv_ids(ids: &[u32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for id in ids {
        for b in id.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

#[test]
fn draws_match_llamacpp() {
    let fx = fixture();
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 100);
    let mut failures = Vec::new();
    for case in cases {
        let params = SamplerParams {
            temp: f32_of(&case["temp"]),
            top_k: case["top_k"].as_i64().unwrap() as i32,
            top_p: f32_of(&case["top_p"]),
            min_p: f32_of(&case["min_p"]),
            seed: u64_of(&case["seed"]) as u32,
        };
        let vocab = u64_of(&case["vocab"]) as usize;
        let offset = u64_of(&case["kind_offset"]);
        let mut rows = SplitMix(u64_of(&case["logit_seed"]));
        let mut sampler = Sampler::new(params);
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| u64_of(x) as u32)
            .collect();
        assert_eq!(want.len() as u64, u64_of(&case["steps"]));
        let got: Vec<u32> = (0..want.len() as u64)
            .map(|j| sampler.sample(&rows.logits(vocab, (j + offset) % 6)))
            .collect();
        if got != want {
            failures.push(format!(
                "{} vocab {} seed {} logit_seed {}: got {got:?}, llama.cpp {want:?}",
                case["name"], vocab, case["seed"], case["logit_seed"]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn reset_replays_the_draws() {
    let fx = fixture();
    // A case drawing from many candidates, so every draw depends on the generator state.
    let case = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "all_off" && c["vocab"] == 1000)
        .unwrap();
    let params = SamplerParams {
        temp: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: u64_of(&case["seed"]) as u32,
    };
    let want: Vec<u32> = case["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| u64_of(x) as u32)
        .collect();
    let mut sampler = Sampler::new(params);
    let mut rows = SplitMix(0);
    for _ in 0..5 {
        sampler.sample(&rows.logits(1000, 0));
    }
    sampler.reset();
    let offset = u64_of(&case["kind_offset"]);
    let mut rows = SplitMix(u64_of(&case["logit_seed"]));
    let got: Vec<u32> = (0..want.len() as u64)
        .map(|j| sampler.sample(&rows.logits(1000, (j + offset) % 6)))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn stages_leave_llamacpp_order() {
    let fx = fixture();
    let stages = fx["stages"].as_array().unwrap();
    assert!(!stages.is_empty());
    let mut failures = Vec::new();
    for st in stages {
        let vocab = u64_of(&st["vocab"]) as usize;
        let arg = f32_of(&st["arg"]);
        let mut rows = SplitMix(u64_of(&st["logit_seed"]));
        let mut c = Candidates::from_logits(&rows.logits(vocab, u64_of(&st["kind"])));
        match st["stage"].as_str().unwrap() {
            "top_k" => c.top_k(arg as i32),
            "top_p" => c.top_p(arg, 0),
            "min_p" => c.min_p(arg, 0),
            "temp" => c.temp(arg),
            other => panic!("unknown stage {other}"),
        }
        let mut ok = c.len() as u64 == u64_of(&st["len"])
            && c.is_sorted() == st["sorted"].as_bool().unwrap();
        if let Some(kept) = st.get("kept") {
            let first_live = c
                .as_slice()
                .iter()
                .position(|t| t.logit != f32::NEG_INFINITY);
            ok &= first_live == Some(u64_of(kept) as usize);
        } else {
            let ids = c.ids();
            let head: Vec<u32> = st["head"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| u64_of(x) as u32)
                .collect();
            ok &= ids[..head.len().min(ids.len())] == head[..];
            ok &= format!("{:016x}", fnv_ids(&ids)) == st["fnv"].as_str().unwrap();
        }
        if !ok {
            failures.push(format!(
                "{} {} vocab {} kind {}: len {} sorted {}, llama.cpp len {} sorted {}",
                st["stage"],
                arg,
                vocab,
                st["kind"],
                c.len(),
                c.is_sorted(),
                st["len"],
                st["sorted"]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} stages differ:\n{}",
        failures.len(),
        stages.len(),
        failures.join("\n")
    );
}
