//! Token sampling that picks the same token as llama.cpp.
//!
//! [`Sampler`] runs llama.cpp's default sampler chain (as its `common_sampler` builds it with
//! default settings, the stages that are no-ops at their defaults left out):
//! top-k → top-p → min-p → temperature → seeded draw. At `temp <= 0` the temperature stage
//! keeps only the highest logit, so the draw is greedy. The draw uses the Mersenne Twister
//! (`std::mt19937`) seeded like llama.cpp's `dist` sampler and libstdc++'s conversion of its
//! outputs to a double, and every stage keeps llama.cpp's float arithmetic and element order, so
//! for the same logits, parameters and seed the drawn ids are llama.cpp's (see docs/sampler.md).

mod candidates;
mod cxxsort;
mod mt19937;

pub use candidates::{Candidates, TokenData};
pub use mt19937::Mt19937;

/// The seed value that means "pick a random seed" (llama.cpp's `LLAMA_DEFAULT_SEED`).
pub const RANDOM_SEED: u32 = 0xFFFF_FFFF;

/// Sampling parameters. [`Default`] gives llama.cpp's defaults (`common_params_sampling`):
/// temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, random seed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerParams {
    /// Temperature; `<= 0` samples greedily: the highest logit, and among equal highest logits
    /// the first in the order the earlier stages leave (the lowest id when top-k and top-p are
    /// off; top-k's and top-p's sorts put equal logits in libstdc++'s order, as llama.cpp does).
    pub temp: f32,
    /// Keep the `top_k` highest logits; `<= 0` disables.
    pub top_k: i32,
    /// Keep the smallest set of most probable tokens whose probabilities sum to at least
    /// `top_p`; `>= 1` disables.
    pub top_p: f32,
    /// Drop tokens less probable than `min_p` times the most probable one; `<= 0` disables.
    pub min_p: f32,
    /// Seed of the draw; [`RANDOM_SEED`] picks one at random ([`Sampler::seed`] tells which).
    pub seed: u32,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            seed: RANDOM_SEED,
        }
    }
}

/// llama.cpp's `min_keep` default: top-p and min-p may cut down to one token.
const MIN_KEEP: usize = 0;

/// A stateful token sampler: its random generator advances by one draw per [`Sampler::sample`]
/// call, as llama.cpp's does, so a sequence of calls reproduces llama.cpp's sequence.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplerParams,
    seed: u32,
    rng: Mt19937,
    cand: Candidates,
}

/// A place in a [`Sampler`]'s random sequence ([`Sampler::mark`]).
#[derive(Clone, Debug)]
pub struct SamplerMark(Mt19937);

/// A seed from the clock and the process's hash randomness, for [`RANDOM_SEED`].
fn random_seed() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    let x = h.finish();
    (x ^ (x >> 32)) as u32
}

fn resolve_seed(seed: u32) -> u32 {
    if seed == RANDOM_SEED {
        random_seed()
    } else {
        seed
    }
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Self {
        let seed = resolve_seed(params.seed);
        Sampler {
            params,
            seed,
            rng: Mt19937::new(seed),
            cand: Candidates::new(),
        }
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// The seed in use (the random one drawn for [`RANDOM_SEED`]).
    pub fn seed(&self) -> u32 {
        self.seed
    }

    /// Restarts the random sequence from the seed (a new random seed for [`RANDOM_SEED`]).
    pub fn reset(&mut self) {
        self.seed = resolve_seed(self.params.seed);
        self.rng.reseed(self.seed);
    }

    /// Where the random sequence is now, to come back to with [`Sampler::rewind`] (a caller
    /// that drew ahead and does not use some of the draws).
    pub fn mark(&self) -> SamplerMark {
        SamplerMark(self.rng.clone())
    }

    /// Back to a place of the random sequence [`Sampler::mark`] kept: the next draw is the
    /// one that followed it.
    pub fn rewind(&mut self, mark: &SamplerMark) {
        self.rng.clone_from(&mark.0);
    }

    /// Picks the next token id from one row of logits (index = token id).
    ///
    /// Each call takes one draw from the generator, greedy ones included. NaN logits are taken
    /// as -inf.
    ///
    /// # Panics
    /// If `logits` is empty or longer than `u32::MAX`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        assert!(!logits.is_empty(), "sampling from an empty logit row");
        self.cand.fill(logits);
        let p = self.params;
        self.cand.top_k(p.top_k);
        self.cand.top_p(p.top_p, MIN_KEEP);
        self.cand.min_p(p.min_p, MIN_KEEP);
        self.cand.temp(p.temp);
        // Every stage leaves at least one candidate of a non-empty list.
        let i = self.cand.dist(&mut self.rng).unwrap_or(0);
        self.cand.as_slice().get(i).map_or(0, |t| t.id)
    }

    /// The candidates the last [`Sampler::sample`] drew from, in llama.cpp's order, with their
    /// final logits and normalised probabilities.
    pub fn candidates(&self) -> &[TokenData] {
        self.cand.as_slice()
    }
}
