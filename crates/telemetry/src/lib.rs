//! The telemetry file formats and what reads them offline: MoE routing traces and offline
//! expert-cache replay. This crate knows no engine: each format is a typed record with its
//! writer and its parser, so that a column changes in one place.
//!
//! [`bmoe_metrics`] is the `--csv` file (`# bmoe_metrics v2`: the run's settings, a row per
//! decoded token, a `# summary` trailer per generation); [`bmoe_session`] the `BMOE_*` lines of
//! `--progress` and `--session` (BigMoeOnEdge's telemetry contract, docs/telemetry.md).
//!
//! [`parse`] reads the `route_trace v1` long-format CSV (one row per routed expert, a `#`
//! preamble with the model's shape and the bytes of one expert per layer) and groups its rows
//! into *layer batches*: the experts one MoE layer routed in one forward call. [`replay`] runs
//! those batches through a fixed-budget expert cache under a given eviction policy and counts
//! hits and flash bytes read, decode phase separately from prefill. See docs/replay.md.

pub mod analysis;
pub mod bmoe_metrics;
pub mod bmoe_session;
mod error;
mod json;
pub mod parse;
pub mod replay;

pub use error::TraceError;
pub use parse::{LayerInfo, Phase, RouteRow, RouteTrace, read_route_trace};
pub use replay::{Batch, CacheModel, Policy, ReplayStats, Workload, batches, replay};
