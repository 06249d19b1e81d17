//! The expert store of a Mixture-of-Experts model.
//!
//! [`ExpertLayout`] says where every routed expert's bytes are: for each MoE layer, the expert
//! tensors (`ffn_{gate,up,down}_exps`, or the fused `ffn_gate_up_exps` with `ffn_down_exps`,
//! and their `.bias` companions), each holding `n_expert` experts back to back at a fixed
//! stride, in whichever shard of a split model holds it. Everything else — attention, norms,
//! routers, shared experts, dense layers, embeddings — is dense and stays resident. The layout
//! is what an expert cache reads a miss from (one window per part) and what it budgets with
//! (`expert_bytes` per layer).
//!
//! [`ExpertCache`] holds experts in slots within a byte budget, batch by batch, behind an
//! [`EvictionPolicy`] ([`Lru`], or [`Forecast`]: eviction by forecast next use). [`ExpertReader`] fills a slot from the files, with
//! O_DIRECT where the file system allows it.

pub mod cache;
pub mod couple;
mod error;
pub mod lanes;
mod layout;
pub mod policy;
pub mod read;
pub mod usage;

pub use cache::{CacheStats, EvictionPolicy, ExpertCache, Lookup, Lru};
pub use couple::Couple;
pub use error::StoreError;
pub use lanes::{Backend, IoLanes, ReadDone, ReadJob, uring_available};
pub use layout::{ExpertLayout, ExpertPart, Fusion, LayerExperts, PartKind};
pub use policy::{Adaptive, Forecast};
pub use read::{ExpertReader, IoMode, ReadFault, Window, WindowRead};
pub use usage::{ReadOutcome, Usage, UsageError};
