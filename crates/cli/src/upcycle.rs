//! `sluice upcycle`'s front end: [`transform::upcycle`] writes the file, this says what it wrote.

use anyhow::Result;
use transform::upcycle::Options;

pub fn run(opts: &Options) -> Result<()> {
    let u = transform::upcycle::upcycle(opts)?;
    eprintln!(
        "sluice: wrote {} ({}, {} MoE layers, {} experts, top-{})",
        opts.out.display(),
        u.arch,
        u.layers,
        u.experts,
        u.top_k
    );
    Ok(())
}
