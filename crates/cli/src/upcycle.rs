//! `sluice upcycle`'s front end: [`transform::upcycle`] writes the file, this shows its
//! progress and says what it wrote.

use anyhow::Result;
use transform::upcycle::Options;

use crate::progress::{Progress, Unit};

pub fn run(opts: &Options) -> Result<()> {
    let mut bar = Progress::new("sluice: upcycle: writing", 0, Unit::Bytes);
    let u = transform::upcycle::upcycle_with(opts, &mut |done, total| {
        if total != bar.total() {
            bar = Progress::new("sluice: upcycle: writing", total, Unit::Bytes);
        }
        bar.set(done, "");
    })?;
    bar.clear();
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
