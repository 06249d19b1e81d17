//! The `sluice` command line.

fn main() {}
