//! The telemetry file formats and what reads them offline. This crate knows no engine: each
//! format is a module with its typed record, its writer and its parser side by side (and a
//! round-trip test), so that a column changes in one place.
//!
//! - [`route_trace`]: `route_trace v1`, the long-format CSV of `sluice run --route-trace` (one
//!   row per routed expert, a `#` preamble with the model's shape and the bytes of one expert
//!   per layer).
//! - [`route_stream`]: colibri's `ROUTE_TRACE` stream (`--route-trace-stream`), a line per MoE
//!   layer call and batch row.
//! - [`io_trace`]: `io_trace v1` (`--io-trace`), a row per window the expert store read.
//! - [`compute_trace`]: `compute_trace v1` (`--compute-trace`), a row per named intermediate or
//!   layer segment of a forward pass.
//! - [`pairs`]: `sluice pairs v1`, the co-activation table of `sluice analyze pairs`.
//! - [`bmoe_metrics`]: the `--csv` file (`# bmoe_metrics v2`: the run's settings, a row per
//!   decoded token, a `# summary` trailer per generation).
//! - [`bmoe_session`]: the `BMOE_*` lines of `--progress` and `--session` (BigMoeOnEdge's
//!   telemetry contract, docs/telemetry.md).
//!
//! [`table`] is the CSV layout the io and compute traces share (columns by name), [`Phase`]
//! the `phase` column of every trace.
//!
//! Offline, [`analysis`] measures a routing trace and [`replay`] groups its rows into *layer
//! batches* (the experts one MoE layer routed in one forward call), runs them through a
//! fixed-budget expert cache under a given eviction policy and counts hits and flash bytes read,
//! decode phase separately from prefill. See docs/replay.md.

pub mod analysis;
pub mod bmoe_metrics;
pub mod bmoe_session;
pub mod compute_trace;
mod error;
pub mod io_trace;
mod json;
pub mod pairs;
mod phase;
pub mod replay;
pub mod route_stream;
pub mod route_trace;
pub mod table;

pub use error::TraceError;
pub use phase::Phase;
pub use replay::{Batch, CacheModel, Policy, ReplayStats, Workload, batches, replay};
pub use route_trace::{LayerInfo, RouteRow, RouteTrace, key_values, read_route_trace};
pub use table::ReadError;
