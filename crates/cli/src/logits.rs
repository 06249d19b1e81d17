//! `sluice logits`: the logits of every prompt position, written as a numpy .npy file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result, bail};
use engine::ops::KvType;
use engine::{EngineConfig, LogitsWanted};
use quant::ThreadPool;
use text::Tokenizer;

use crate::npy;
use runtime::load::{build_engine, load_model_routed, thread_count};

pub struct Options {
    pub model: PathBuf,
    pub prompt: Option<String>,
    pub tokens: Option<Vec<u32>>,
    pub out: PathBuf,
    pub kv_type: KvType,
    pub threads: Option<usize>,
    pub ctx: Option<usize>,
    pub ubatch: usize,
    /// `--row-prefetch`: `None` keeps the kernel table's choice.
    pub row_prefetch: Option<bool>,
    /// The multi-row kernels in one-token products (`None`: measured, as `run`).
    pub multi_row: Option<bool>,
    /// Directory for the named intermediates, if wanted.
    pub dump: Option<PathBuf>,
    /// Only these names (all when `None`).
    pub dump_names: Option<Vec<String>>,
    pub stream: runtime::settings::stream::StreamConfig,
    /// Only the last position's logits, computed as a generation computes them.
    pub last: bool,
    /// `--n-expert-used` (lossy): experts per token in every MoE layer.
    pub n_expert_used: Option<u32>,
}

/// Named intermediates collected over the whole forward pass: file stem → values, chunk after
/// chunk (token-major, as the engine reports them).
type Dumps = Arc<Mutex<BTreeMap<String, Vec<f32>>>>;

pub fn run(opts: &Options) -> Result<()> {
    let name = opts.model.display().to_string();
    let notices = crate::stderr_notices();
    let opened = runtime::open::open_for(&opts.model, &opts.stream, opts.n_expert_used, &notices)?;
    let file = opened.file;
    let model = load_model_routed(&file, &opts.model, opts.n_expert_used)?;
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
    if let Some(on) = opts.row_prefetch {
        engine.set_row_prefetch(on);
    }
    runtime::load::apply_multi_row(
        &mut engine,
        &file,
        opts.multi_row,
        opts.row_prefetch,
        &notices,
    );
    if let Some(layout) = opened.layout {
        let src = runtime::source::StoreSource::from_settings(
            &opts.stream,
            &file,
            layout,
            opened.cache_bytes,
            &name,
            Arc::default(),
            &notices,
        )?;
        engine.set_expert_source(Some(Box::new(src)))?;
    }
    let dumps: Dumps = Arc::default();
    if let Some(dir) = &opts.dump {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the dump directory {}", dir.display()))?;
        let sink = Arc::clone(&dumps);
        let names = opts.dump_names.clone();
        engine.set_observer(Some(Box::new(move |name, layer, data| {
            if names.as_ref().is_some_and(|n| !n.iter().any(|x| x == name)) {
                return;
            }
            let stem = match layer {
                Some(il) => format!("{name}-{il}"),
                None => name.to_owned(),
            };
            let mut map = sink.lock().unwrap_or_else(PoisonError::into_inner);
            map.entry(stem).or_default().extend_from_slice(data);
        })));
    }
    let wanted = if opts.last {
        LogitsWanted::Last
    } else {
        LogitsWanted::All
    };
    let logits = engine.forward(&ids, wanted)?;
    let n_vocab = engine.n_vocab();
    let rows = if opts.last { 1 } else { ids.len() };
    write_npy(&opts.out, &[rows as u64, n_vocab as u64], &logits)?;
    eprintln!(
        "sluice: wrote {rows} x {n_vocab} logits to {}",
        opts.out.display()
    );
    if let Some(dir) = &opts.dump {
        let map = dumps.lock().unwrap_or_else(PoisonError::into_inner);
        let n = ids.len();
        for (stem, values) in map.iter() {
            // Every intermediate covers every token; a length that does not divide is kept flat.
            let shape = if values.len() % n == 0 {
                vec![n as u64, (values.len() / n) as u64]
            } else {
                vec![values.len() as u64]
            };
            write_npy(&dir.join(format!("{stem}.npy")), &shape, values)?;
        }
        eprintln!(
            "sluice: wrote {} named intermediates to {}",
            map.len(),
            dir.display()
        );
    }
    Ok(())
}

fn write_npy(path: &Path, shape: &[u64], values: &[f32]) -> Result<()> {
    let f = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut w = BufWriter::new(f);
    w.write_all(&npy::f32_header(shape))
        .and_then(|()| npy::write_f32s(&mut w, values))
        .and_then(|()| w.flush())
        .with_context(|| format!("cannot write {}", path.display()))
}
