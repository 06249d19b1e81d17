//! The run's settings, grouped by concern: plain values a front end fills in (the `sluice`
//! binary from its flags), each group with its own check.

pub mod stream;
