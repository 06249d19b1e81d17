//! Forward-pass building blocks.
//!
//! [`ops`] holds the numerical operations of a transformer layer (RMS norm, rotary position
//! embedding, softmax, SiLU/SwiGLU, mixture-of-experts routing and attention over a KV cache),
//! each written to reproduce what ggml's CPU backend computes, so that a forward pass built
//! from them matches llama.cpp's logits closely. See `docs/engine-ops.md` for the numerics.

mod error;
pub mod forward;
pub mod ops;

pub use error::EngineError;
pub use forward::{
    AbortCheck, CacheAware, CacheAwareCounts, Engine, EngineConfig, ExpertProj, ExpertSource,
    Foresight, ForesightTap, ForwardError, KvState, LogitsWanted, Lookahead, Observer, RouteReplay,
    RouteTap, Routed,
};
