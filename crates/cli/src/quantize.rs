//! `sluice quantize`'s front end: the progress lines of [`transform::quantize`] (which has the
//! type rules and writes the file).

use anyhow::Result;
use gguf::TensorType;
use transform::quantize::{Event, Options};

use crate::progress::{Progress, Unit};

pub fn run(opts: &Options, quiet: bool) -> Result<()> {
    // On a terminal a bar over the tensors; otherwise a line per tensor.
    let tty = crate::progress::stderr_is_tty();
    let mut bar: Option<Progress> = None;
    let mut on = |e: Event<'_>| match e {
        Event::Fallback(w) => {
            if let Some(b) = &mut bar {
                b.clear();
            }
            eprintln!("sluice: warning: {w}");
        }
        Event::Tensor {
            index, count, name, ..
        } if !quiet && tty => bar
            .get_or_insert_with(|| Progress::new("sluice: quantize", count as u64, Unit::Items))
            .set(index as u64 + 1, name),
        Event::Tensor {
            index,
            count,
            name,
            dims,
            from,
            to,
        } if !quiet => {
            let ty = |t: TensorType| match t {
                TensorType::Known(t) => t.name().to_owned(),
                TensorType::Unknown(id) => format!("type {id}"),
            };
            let shape = dims
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let what = if from == to {
                format!("{} (copied)", ty(from))
            } else {
                format!("{} -> {}", ty(from), ty(to))
            };
            eprintln!("[{:>4}/{count:>4}] {name:<36} [{shape}] {what}", index + 1);
        }
        Event::Tensor { .. } => {}
    };
    let q = transform::quantize::quantize(opts, &mut on)?;
    if let Some(b) = &mut bar {
        b.clear();
    }
    if !quiet {
        eprintln!(
            "sluice: wrote {} ({}, {} tensors, {:.2} MiB -> {:.2} MiB)",
            opts.out.display(),
            opts.ftype.name(),
            q.tensors,
            q.bytes_in as f64 / 1048576.0,
            q.bytes_out as f64 / 1048576.0,
        );
    }
    Ok(())
}
