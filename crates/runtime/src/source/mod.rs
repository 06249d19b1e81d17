//! The engine's source of routed experts when they stream: [`StoreSource`], an
//! [`engine::ExpertSource`] backed by the expert store (layout, bounded cache, I/O lanes), set up
//! from the streaming settings ([`StoreSource::from_settings`]), and the counters it shares with
//! the run loop and a route trace ([`StreamCounters`], [`BatchView`]).
//!
//! Serial mode: a layer's misses are all handed to the lanes at once and a one-token layer
//! computes when every one is in; a prompt batch (more than one token) computes each expert as
//! soon as its bytes are in, in file order, and its waits are its I/O time. `--overlap`: every
//! layer computes each expert as soon as its bytes are in — resident ones first — and waits only
//! when nothing ready is left; the wait is the stall. With `--prompt-ahead`, a prompt batch that
//! routes most of a layer's experts reads the next MoE layer's ahead
//! ([`PROMPT_AHEAD_SHARE`]).

mod counters;
mod store_source;

pub use counters::{BatchView, StreamCounters, StreamSnapshot};
pub use store_source::{PROMPT_AHEAD_SHARE, SourceConfig, Speculation, StoreSource};
