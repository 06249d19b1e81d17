//! Opening a model and building its engine, with errors that name the file.

use crate::error::refuse;
use crate::refusal::Setting;
use std::path::Path;

use engine::{Engine, EngineConfig};
use gguf::GgufFile;
use model::Model;
use quant::{Kernels, ThreadPool};

use crate::error::{Context, Result};
use crate::notice::Notices;

/// Threads to use: the given count, or every core the process may use.
pub fn thread_count(threads: Option<usize>) -> usize {
    threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

/// Opens a model that runs fully resident: its pages are read and mapped at once (as
/// llama.cpp's loader does), so that the first forward pass does not pay a page fault at each
/// first touch of a weight.
pub fn open_model(path: &Path) -> Result<GgufFile> {
    // The reader's errors name the file themselves.
    Ok(GgufFile::open_resident(path)?)
}

/// The model's graph description, with errors naming the file.
pub fn load_model<'a>(file: &'a GgufFile, path: &Path) -> Result<Model<'a>> {
    Model::from_gguf(file).with_context(|| format!("{}: cannot load the model", path.display()))
}

/// [`load_model`], routing to `n_expert_used` experts per token in every MoE layer instead of
/// the file's `expert_used_count` where it is `Some` (`--n-expert-used`, lossy); refused for a
/// model without routed experts and for a count outside `1..=n_expert`.
pub fn load_model_routed<'a>(
    file: &'a GgufFile,
    path: &Path,
    n_expert_used: Option<u32>,
) -> Result<Model<'a>> {
    let mut model = load_model(file, path)?;
    route_to(&mut model.hparams, n_expert_used, path)?;
    Ok(model)
}

/// Sets `hp`'s experts per token in every layer to `n_expert_used` where it is `Some`
/// (`--n-expert-used`), after checking it against the model.
pub fn route_to(hp: &mut model::HParams, n_expert_used: Option<u32>, path: &Path) -> Result<()> {
    if let Some(k) = n_expert_used {
        check_n_expert_used(k, hp.n_expert, path)?;
        hp.n_expert_used.set_all(k);
    }
    Ok(())
}

/// `--n-expert-used k` for a model of `n_expert` routed experts: `1..=n_expert`.
pub fn check_n_expert_used(k: u32, n_expert: u32, path: &Path) -> Result<()> {
    if n_expert == 0 {
        refuse!(Setting::NExpertUsed;
            Setting::NExpertUsed,
            format!(
                ": {} has no routed experts (not a mixture-of-experts model)",
                path.display()
            ),
        );
    }
    if k == 0 || k > n_expert {
        refuse!(Setting::NExpertUsed;
            Setting::NExpertUsed,
            format!(
                " {k}: {} has {n_expert} experts per MoE layer; the count must be 1 to {n_expert}",
                path.display()
            ),
        );
    }
    Ok(())
}

/// The engine for `model`, with errors naming the file.
pub fn build_engine<'a>(
    model: &Model<'a>,
    pool: &'a ThreadPool,
    cfg: EngineConfig,
    path: &Path,
) -> Result<Engine<'a>> {
    Engine::new(model, Kernels::detect(), pool, cfg)
        .with_context(|| format!("{}: cannot prepare the model", path.display()))
}

/// Whether `engine`'s one-token products use the multi-row kernels: as `setting` says, else as
/// measured on this CPU for each weight type and summation order that has them (once per
/// process and pair, said in `notices`) for a model too large to stay in the caches
/// (`quant::calibrate::STREAMED_MODEL_BYTES`; a smaller one keeps them). Where the measurement
/// picks one row a call and `prefetch` (`--row-prefetch`) is unset, it also decides those
/// products' row prefetch; so it does, measured alike, for the one-token products of the types
/// without multi-row kernels (the i-quants and ternary types, among others). The output is the
/// same bits either way.
pub fn apply_multi_row(
    engine: &mut Engine<'_>,
    file: &GgufFile,
    setting: Option<bool>,
    prefetch: Option<bool>,
    notices: &Notices,
) {
    if let Some(on) = setting {
        engine.set_multi_row(on);
    }
    if file.file_len() < quant::calibrate::STREAMED_MODEL_BYTES {
        return;
    }
    let mut chosen = Vec::new();
    let pairs = if setting.is_none() {
        engine.one_token_multi_row_kernels()
    } else {
        Vec::new()
    };
    for (w, order) in pairs {
        let Some(c) = quant::multi_row_calibration_for(w, order) else {
            continue;
        };
        let on = c.multi_row_pays();
        // One row a call, with the row prefetch unless the measurement says it costs (and
        // --row-prefetch did not choose).
        let prefetch_off = !on && prefetch.is_none() && !c.single_row_prefetch_pays();
        chosen.push(format!(
            "{}: {}{} ({:.1} GB/s with several rows a call, {:.1} one row, {:.1} one row without the row prefetch)",
            pair_name(w, order),
            if on {
                "several rows a call"
            } else {
                "one row a call"
            },
            if prefetch_off {
                ", without the row prefetch"
            } else {
                ""
            },
            c.multi_gbs,
            c.single_gbs,
            c.single_nopf_gbs
        ));
        if !on {
            engine.set_multi_row_for(w, order, false);
        }
        if prefetch_off {
            engine.set_one_token_row_prefetch_for(w, order, false);
        }
    }
    let pairs = if prefetch.is_none() {
        engine.one_token_row_prefetch_kernels()
    } else {
        Vec::new()
    };
    for (w, order) in pairs {
        let Some(c) = quant::row_prefetch_calibration_for(w, order) else {
            continue;
        };
        chosen.push(format!(
            "{}: one row a call, {} ({:.1} GB/s with the row prefetch, {:.1} without)",
            pair_name(w, order),
            if c.pays() {
                "with the row prefetch"
            } else {
                "without the row prefetch"
            },
            c.with_gbs,
            c.without_gbs
        ));
        if !c.pays() {
            engine.set_one_token_row_prefetch_for(w, order, false);
        }
    }
    if !chosen.is_empty() {
        notices.info(format!(
            "sluice: decode kernels, measured: {}; --multi-row, --row-prefetch to choose",
            chosen.join("; ")
        ));
    }
}

/// A weight type and, unless it is llama.cpp's `vec_dot` order, its summation order, for
/// notices.
fn pair_name(w: gguf::GgmlType, order: quant::SumOrder) -> String {
    if order == quant::SumOrder::VecDot {
        w.to_string()
    } else {
        format!("{w} in the {} order", order_name(order))
    }
}

/// Lower-case name of a summation order for notices.
fn order_name(order: quant::SumOrder) -> &'static str {
    match order {
        quant::SumOrder::VecDot => "vec_dot",
        quant::SumOrder::Repacked => "repacked",
        quant::SumOrder::TinyBlas => "tinyBLAS",
        quant::SumOrder::IqPanel => "i-quant panel",
    }
}
