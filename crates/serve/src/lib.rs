//! `sluice serve`: the engine behind an OpenAI-compatible HTTP API and a live dashboard.
//!
//! One loaded model, one engine thread ([`Server::serve`] over the runtime's
//! [`Session`](runtime::session::Session), the same generation loop `sluice run` uses), a
//! bounded FIFO of generation requests, a thread per connection. Endpoints:
//! `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health`,
//! `GET /v1/telemetry` (a summary) and `GET /v1/telemetry/events` (per-token records as
//! server-sent events), and the dashboard at `/`.
//!
//! Safe by default: a loopback server answers only loopback host names, a state-changing
//! request from a foreign browser origin is refused, heads and bodies have size limits, and an
//! API key, when set, is compared in constant time.

pub mod api;
pub mod guard;
pub mod http;
pub mod hub;
pub mod queue;
pub mod server;

pub use server::{Config, Server};
