//! `sluice gen-model`'s front end: its flags, where the preset's vocabulary is found, the
//! `--plan` table and the progress lines. [`transform::genmodel`] plans and writes the file.

use std::cell::Cell;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use transform::genmodel::{Event, ExpertTypes, Like, Options, Plan};
use transform::quantize::FileType;

use crate::progress::{Progress, Unit};

#[derive(clap::Args, Debug)]
pub struct GenModelArgs {
    /// The real model whose architecture, tensor names, shapes and types to reproduce.
    #[arg(long, value_parser = crate::args::like(), value_name = "NAME")]
    like: Like,

    /// The file type (llama.cpp's mixes, as `sluice quantize --type`, but for the ternary
    /// TQ1_0 and TQ2_0, whose blocks gen-model cannot fill) [default: the one the published
    /// files use: MXFP4_MOE (MXFP4 experts, Q8_0 elsewhere) for gpt-oss, Q4_K_M (Q4_K with
    /// Q6_K on half of attn_v and ffn_down and on output.weight) for the others].
    #[arg(long, value_parser = crate::args::gen_model_quant(), ignore_case = true, value_name = "MIX")]
    quant: Option<FileType>,

    /// Types for the routed expert stacks instead of the --quant mix's, as GATE_UP,DOWN (ggml
    /// type names): GATE_UP for ffn_gate_exps / ffn_up_exps / ffn_gate_up_exps, DOWN for
    /// ffn_down_exps; everything else keeps the mix's types. `--quant Q4_K_M --expert-types
    /// IQ2_XXS,IQ2_S` is the shape of Unsloth's dynamic UD-IQ2_XXS files (docs/benchmarks.md).
    /// Fillable types: q4_0, q4_1, q5_0, q5_1, q8_0, q2_K … q6_K, iq4_nl, mxfp4, iq2_xxs,
    /// iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq4_xs.
    #[arg(long, value_parser = parse_expert_types, value_name = "GATE_UP,DOWN")]
    expert_types: Option<ExpertTypes>,

    /// Where to write the model (via OUT.part, renamed when complete and synced).
    #[arg(long, value_name = "OUT.gguf", required_unless_present = "plan")]
    out: Option<PathBuf>,

    /// Keep only the first N layers (a shallower model of the same width). The cut keeps at
    /// least one MoE layer: the leading dense layers (deepseek-v3's 3, kimi-k2's and
    /// glm-4.5-air's 1) become at most N - 1. Per-layer patterns (sliding-window and full
    /// attention, linear-attention layers) are the first N layers'; gemma-4's rope_freqs is
    /// written only when the cut has a full-attention layer (N >= 6); glm-4.5-air's NextN
    /// layer follows the cut trunk. A deepseek-v3 / kimi-k2 cut of 26 or 27 layers gets one
    /// attn_q instead of the low-rank query: llama.cpp reads such a file as
    /// DeepSeek-V2-Lite's layout. The nemotron presets keep the first N letters of their
    /// hybrid pattern (N = 1: a single Mamba-2 layer, no MoE layer).
    #[arg(long, value_name = "N")]
    layers: Option<u32>,

    /// A GGUF to copy the tokenizer (`tokenizer.*` metadata) from [default: the preset's
    /// tokenizer in the fixture cache, `<fixtures>/text/vocab/`, which
    /// scripts/fetch_text_fixtures.sh fills].
    #[arg(long, value_name = "VOCAB.gguf")]
    vocab: Option<PathBuf>,

    /// How unequal the experts' popularity is: each expert's router row is scaled by
    /// exp(SKEW · z), z standard normal; 0 routes uniformly at random. See docs/benchmarks.md
    /// for how the hit-rate curve compares with a real trace.
    #[arg(long, default_value_t = 0.0, value_name = "SKEW")]
    router_skew: f32,

    /// Experts used per token (`<arch>.expert_used_count`) instead of the real model's, e.g. to
    /// match a routing trace recorded with another top-k.
    #[arg(long, value_name = "K")]
    experts_used: Option<u32>,

    /// Standard deviation of the attention output projection's weights (every other matrix:
    /// 0.02). It sets how alike consecutive tokens route: with random weights the attention
    /// averages over the context, and the larger its share of the residual stream, the more
    /// every token routes like the one before. The default 0.0045 gives the 48-layer
    /// qwen3-30b-a3b LRU and Bélády hit-rate curves close to the real model's routing trace
    /// (docs/benchmarks.md); 0.02 routes nearly the same experts every token, 0.002 nearly at
    /// random.
    #[arg(long, default_value_t = 0.0045, value_name = "STD")]
    attn_out_std: f32,

    /// Seed of every random byte (the file is a function of the arguments and the vocabulary).
    #[arg(long, default_value_t = 0)]
    seed: u64,

    /// Print the tensor table (data offset, bytes, type, shape, name), the tensor data size
    /// and each layer's expert and dense bytes, and write nothing. Needs no vocabulary unless
    /// --vocab is given.
    #[arg(long, conflicts_with = "out")]
    plan: bool,

    /// A chat template (a Jinja text file) for `tokenizer.chat_template`, replacing the
    /// vocabulary file's, so that `run --chatml` and chat sessions run on the model.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,

    /// No progress lines.
    #[arg(short, long)]
    quiet: bool,
}

/// Where the fixture cache is: `$SLUICE_FIXTURES`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures` (the rule of the fetch scripts and of the
/// tests' `testdata::fixtures_root`).
pub fn fixtures_root() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(root) = var("SLUICE_FIXTURES") {
        return PathBuf::from(root);
    }
    var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(var("HOME").unwrap_or_default()).join(".cache"))
        .join("sluice/fixtures")
}

/// The preset's tokenizer in the fixture cache.
fn default_vocab(like: Like) -> Result<PathBuf> {
    let path = fixtures_root()
        .join("text/vocab")
        .join(like.vocab_fixture());
    if !path.is_file() {
        bail!(
            "no vocabulary given and {} does not exist: run scripts/fetch_text_fixtures.sh \
             (it fills the fixture cache) or pass --vocab with a GGUF holding a {} tokenizer",
            path.display(),
            like.title()
        );
    }
    Ok(path)
}

/// The tensor table without writing anything: offset in the data section (32-byte aligned, as
/// written), bytes, type, shape (ggml order) and name, then the totals and per-layer bytes.
fn print_plan(plan: &Plan) -> Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "offset\tbytes\ttype\tdims\tname")?;
    for t in &plan.tensors {
        let dims: Vec<String> = t.dims.iter().map(u64::to_string).collect();
        writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}",
            t.offset,
            t.bytes,
            t.ty.name(),
            dims.join("x"),
            t.name
        )?;
    }
    writeln!(out, "# tensor data: {} bytes", plan.data_bytes)?;
    for (il, l) in plan.layer_bytes().iter().enumerate() {
        writeln!(
            out,
            "# layer={il} expert_bytes={} dense_bytes={}",
            l.expert, l.dense
        )?;
    }
    Ok(())
}

pub fn run(args: GenModelArgs) -> Result<()> {
    // --plan without --vocab needs no vocabulary: the preset's size stands.
    let vocab = match args.vocab {
        Some(p) => Some(p),
        None if args.plan => None,
        None => Some(default_vocab(args.like)?),
    };
    let opts = Options {
        like: args.like,
        quant: args.quant,
        layers: args.layers,
        vocab,
        router_skew: args.router_skew,
        experts_used: args.experts_used,
        attn_out_std: args.attn_out_std,
        seed: args.seed,
        chat_template: args.chat_template,
        expert_types: args.expert_types,
    };
    let (quiet, title) = (args.quiet, args.like.title());
    // The rates count from the start of the write.
    let start = Cell::new(Instant::now());
    // A bar on a terminal, a line every few seconds otherwise.
    let mut bar: Option<Progress> = None;
    let mut on = |e: Event| match e {
        Event::VocabSize { tokens, real } if !quiet => eprintln!(
            "sluice: gen-model: the vocabulary has {tokens} tokens, {title} has {real}: the \
             embedding and output matrices get {tokens} rows"
        ),
        Event::Progress { done, total } if !quiet => bar
            .get_or_insert_with(|| Progress::new("sluice: gen-model", total, Unit::Bytes))
            .set(done, ""),
        _ => {}
    };
    let plan = transform::genmodel::plan(&opts, &mut on)?;
    if args.plan {
        return print_plan(&plan);
    }
    let Some(out) = &args.out else {
        bail!("--out is required");
    };
    if !quiet {
        eprintln!(
            "sluice: gen-model: writing {} ({} {}, {} layers, {:.2} GB of tensors)",
            out.display(),
            plan.title,
            plan.quant.name(),
            plan.n_layer,
            plan.tensor_bytes() as f64 / 1e9
        );
    }
    start.set(Instant::now());
    let written = transform::genmodel::write(plan, out, &mut on)?;
    if let Some(b) = &mut bar {
        b.clear();
    }
    let secs = start.get().elapsed().as_secs_f64();
    eprintln!(
        "sluice: gen-model: wrote {} ({} bytes) in {secs:.1} s ({:.0} MB/s, sync included, {})",
        out.display(),
        written.bytes,
        written.bytes as f64 / 1e6 / secs.max(1e-9),
        if written.direct {
            "direct I/O"
        } else {
            "through the page cache"
        }
    );
    Ok(())
}

/// `--expert-types GATE_UP,DOWN`: two ggml type names (any case).
fn parse_expert_types(v: &str) -> Result<ExpertTypes, String> {
    let ty = |name: &str| {
        gguf::GgmlType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name.trim()))
            .ok_or_else(|| format!("{name:?} is not a ggml type name (e.g. iq2_xxs)"))
    };
    match v.split_once(',') {
        Some((g, d)) => Ok(ExpertTypes {
            gate_up: ty(g)?,
            down: ty(d)?,
        }),
        None => Err(format!("{v:?}: expected GATE_UP,DOWN, e.g. IQ2_XXS,IQ2_S")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fixture_cache_is_where_the_tests_look() {
        assert_eq!(super::fixtures_root(), testdata::fixtures_root());
    }
}
