//! `sluice logits`: the logits of every prompt position, written as a numpy .npy file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use engine::ops::KvType;
use engine::{EngineConfig, LogitsWanted};
use quant::ThreadPool;
use text::Tokenizer;

use crate::npy;
use crate::run::{build_engine, load_model, open_model, thread_count};

pub struct Options {
    pub model: PathBuf,
    pub prompt: Option<String>,
    pub tokens: Option<Vec<u32>>,
    pub out: PathBuf,
    pub kv_type: KvType,
    pub threads: Option<usize>,
    pub ctx: Option<usize>,
    pub ubatch: usize,
}

pub fn run(opts: &Options) -> Result<()> {
    let name = opts.model.display().to_string();
    let file = open_model(&opts.model)?;
    let model = load_model(&file, &opts.model)?;
    let ids = match (&opts.prompt, &opts.tokens) {
        (Some(p), None) => {
            let tokenizer = Tokenizer::from_metadata(file.metadata())
                .with_context(|| format!("{name}: cannot build the tokenizer"))?;
            tokenizer.encode(p, true, false)
        }
        (None, Some(t)) => t.clone(),
        _ => bail!("give either -p PROMPT or --tokens IDS"),
    };
    if ids.is_empty() {
        bail!("no tokens to run");
    }
    let n_ctx = opts.ctx.unwrap_or(ids.len());
    if ids.len() > n_ctx {
        bail!(
            "the prompt is {} tokens, longer than the context of {n_ctx} tokens (-c)",
            ids.len()
        );
    }
    let n_ctx_train = model.hparams.n_ctx_train as usize;
    if n_ctx > n_ctx_train {
        eprintln!(
            "sluice: warning: context {n_ctx} is larger than the model's training context {n_ctx_train}"
        );
    }

    let pool =
        ThreadPool::new(thread_count(opts.threads)).context("cannot start the compute threads")?;
    let cfg = EngineConfig {
        n_ctx,
        kv_type: opts.kv_type,
        ubatch: opts.ubatch,
    };
    let mut engine = build_engine(&model, &pool, cfg, &opts.model)?;
    let logits = engine.forward(&ids, LogitsWanted::All)?;
    let n_vocab = engine.n_vocab();

    let out = &opts.out;
    let f = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut w = BufWriter::new(f);
    w.write_all(&npy::f32_header(&[ids.len() as u64, n_vocab as u64]))
        .and_then(|()| npy::write_f32s(&mut w, &logits))
        .and_then(|()| w.flush())
        .with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!(
        "sluice: wrote {} x {n_vocab} logits to {}",
        ids.len(),
        out.display()
    );
    Ok(())
}
