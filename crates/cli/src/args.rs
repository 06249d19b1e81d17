//! The flag groups several commands share, and how clap offers the runtime's and the
//! transforms' named settings.
//! Each group turns into the runtime's plain settings with `config()`.

use std::path::PathBuf;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use runtime::Choice;
use runtime::history::{HistoryConfig, PinArg};
use runtime::settings::stream::{
    CacheMb, CachePolicy, DenseWeights, ReadBackend, StreamConfig, StreamMode, parse_read_fault,
};
use store::ReadFault;
use transform::genmodel::Like;
use transform::quantize::FileType;

/// A value parser over named values: `values` are the flag's possible values (with their
/// help), `find` turns the spelling given into the value.
fn named<T: Clone + Send + Sync + 'static>(
    values: impl Iterator<Item = PossibleValue>,
    find: fn(&str) -> Option<T>,
) -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(values)
        .try_map(move |name: String| find(&name).ok_or_else(|| format!("`{name}` is not a value")))
}

/// The value parser of a runtime setting with named values: its names (with their help) are
/// the flag's possible values.
pub fn choice<T: Choice + Send + Sync + Clone>() -> impl TypedValueParser<Value = T> {
    named(
        T::ALL.iter().map(|c| {
            let v = PossibleValue::new(c.name());
            if c.help().is_empty() {
                v
            } else {
                v.help(c.help())
            }
        }),
        T::from_name,
    )
}

/// The value parser of a quantization file type (`quantize --type`).
pub fn file_type() -> impl TypedValueParser<Value = FileType> {
    file_types(|_| None)
}

/// The value parser of `gen-model --quant`: only the mixes gen-model can fill are listed and
/// taken; the others are refused with the reason.
pub fn gen_model_quant() -> impl TypedValueParser<Value = FileType> {
    file_types(|t| {
        (!transform::genmodel::fills(t)).then(|| {
            format!(
                "{}: gen-model has no random-block generator for this mix's types; it writes \
                 {}",
                t.name(),
                FileType::ALL
                    .iter()
                    .filter(|&&t| transform::genmodel::fills(t))
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    })
}

/// File types by name: every one `refuse` has no reason against is listed (with its help);
/// the others, and llama.cpp's importance-matrix file types, are taken by name only to be
/// refused with the reason.
fn file_types(refuse: fn(FileType) -> Option<String>) -> impl TypedValueParser<Value = FileType> {
    let values = FileType::ALL.iter().map(move |&t| {
        let v = PossibleValue::new(t.name())
            .help(t.about())
            .hide(refuse(t).is_some());
        match t.alias() {
            Some(a) => v.alias(a),
            None => v,
        }
    });
    // llama.cpp's importance-matrix file types are accepted by name only to be refused with
    // the reason.
    let refused = IMATRIX_FILE_TYPES
        .iter()
        .map(|name| PossibleValue::new(*name).hide(true));
    PossibleValuesParser::new(values.chain(refused)).try_map(move |name: String| {
        let t = FileType::from_name(&name).ok_or_else(|| {
            match IMATRIX_FILE_TYPES
                .iter()
                .find(|n| n.eq_ignore_ascii_case(&name))
            {
                Some(n) => format!(
                    "{n}: llama.cpp's quantizer writes this file type only with an importance \
                     matrix (llama-imatrix, then llama-quantize --imatrix), and `sluice quantize` \
                     takes none; sluice runs such files"
                ),
                None => format!("`{name}` is not a value"),
            }
        })?;
        match refuse(t) {
            Some(why) => Err(why),
            None => Ok(t),
        }
    })
}

/// llama.cpp's file types its quantizer writes only with an importance matrix: it refuses
/// IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S and IQ3_XXS tensors (IQ2_M and IQ3_XS are made of
/// them) and the Q2_K tensors of a Q2_K_S file without one.
const IMATRIX_FILE_TYPES: [&str; 9] = [
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S",
];

/// The value parser of gen-model's presets.
pub fn like() -> impl TypedValueParser<Value = Like> {
    named(
        Like::ALL
            .iter()
            .map(|l| PossibleValue::new(l.name()).help(l.about())),
        Like::from_name,
    )
}

/// Expert streaming flags shared by `run` and `logits`.
#[derive(clap::Args, Debug, Clone)]
pub struct StreamArgs {
    /// Stream routed experts from the model file into a bounded cache (`on`) instead of
    /// reading the whole model into memory (`off`); `auto` streams when the model does not fit
    /// in the available memory minus --cache-floor-mb. The output is the same bit for bit.
    #[arg(long, value_parser = choice::<StreamMode>(), default_value_t = StreamMode::Auto, value_name = "MODE")]
    pub moe_stream: StreamMode,

    /// When streaming: the expert cache's budget: `auto` (decided once at load: available
    /// memory minus --cache-floor-mb minus the dense weights, at least 1500 MiB, at most the
    /// slots of every expert, and at most --cache-ceil-mb), a number of MiB (1 to 1499 only with
    /// --force-cache), or 0 to keep nothing (every routed expert is read every time it is used).
    #[arg(long, value_name = "auto|MiB")]
    pub cache_mb: Option<CacheMb>,

    /// When streaming: which cached expert leaves first when the cache is full: `adaptive`
    /// (forecast's or LRU's choice, whichever a shadow cache kept by each has hit more with
    /// lately), `forecast` (the one whose next use is forecast farthest away, from the experts'
    /// routing so far and the layer cycle) or `lru` (the least recently used); docs/policy.md.
    /// The output is the same either way; the hit rate is not.
    #[arg(long, value_parser = choice::<CachePolicy>(), default_value_t = CachePolicy::DEFAULT, value_name = "POLICY")]
    pub cache_policy: CachePolicy,

    /// When streaming with a cache: after each decode layer, read ahead the experts of the next
    /// layers that this co-activation table (`sluice analyze pairs`) finds most likely to follow
    /// what the layer routed, while it computes (docs/policy.md). The environment's COUPLE=FILE
    /// does the same (colibri's name).
    #[arg(long, value_name = "FILE")]
    pub couple: Option<PathBuf>,

    /// With --couple: experts read ahead per layer [default: 8, or COUPLE_K].
    #[arg(long, value_name = "K")]
    pub couple_k: Option<usize>,

    /// With --couple: how many MoE layers ahead, 1 or 2 [default: 1, or COUPLE_D].
    #[arg(long, value_name = "D", value_parser = clap::value_parser!(u32).range(1..=2))]
    pub couple_d: Option<u32>,

    /// When streaming with a cache: after each decode layer, read ahead the experts the
    /// previous token routed at the next K MoE layers (the previous-token bet), on lanes that
    /// demand reads leave idle and within the lane time they leave spare (docs/predict.md).
    /// The output is the same bit for bit.
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub prefetch: usize,

    /// When streaming with a cache: rank the next MoE layer's router on each decode layer's
    /// FFN input (the stale gate) and read its predicted misses ahead while the layer computes
    /// (at most --predict-spec-max a layer, within the lane time demand reads leave spare);
    /// predicted experts already cached are kept for it. The output is the same bit for bit
    /// (docs/predict.md).
    #[arg(long)]
    pub predict_prefetch: bool,

    /// With --predict-prefetch: predicted misses read ahead per layer, in rank order; 0 reads
    /// nothing and only keeps the predicted experts that are cached [default: 2].
    #[arg(long, value_name = "N")]
    pub predict_spec_max: Option<usize>,

    /// Memory to leave to the rest of the system, in MiB: what --moe-stream auto and
    /// --cache-mb auto subtract from the available memory.
    #[arg(long, default_value_t = 1536, value_name = "MiB")]
    pub cache_floor_mb: u64,

    /// With --cache-mb auto: the most the cache may take, in MiB (0: no cap).
    #[arg(long, default_value_t = 0, value_name = "MiB")]
    pub cache_ceil_mb: u64,

    /// Accept a --cache-mb below 1500 MiB (which is usually below one token cycle of a large
    /// model, where an LRU cache hits nothing).
    #[arg(long)]
    pub force_cache: bool,

    /// When streaming: read experts (and the dense weights) through the page cache instead of
    /// with O_DIRECT.
    #[arg(long)]
    pub no_odirect: bool,

    /// When streaming: I/O lanes, i.e. expert reads in flight at once (each pread lane is a
    /// thread with its own descriptors; io_uring keeps this many reads queued).
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub io_threads: usize,

    /// When streaming: how the lanes read: `pread` (a thread per lane; works everywhere),
    /// `uring` (one io_uring; an error where the kernel refuses it), `auto` (io_uring where
    /// a probe at start succeeds, else pread).
    #[arg(long, value_parser = choice::<ReadBackend>(), default_value_t = ReadBackend::Pread, value_name = "BACKEND")]
    pub io_backend: ReadBackend,

    /// When streaming: compute each expert of a layer as soon as its bytes are in (cached ones
    /// first) while the others are still being read, instead of after every read of the layer.
    #[arg(long)]
    pub overlap: bool,

    /// When streaming: read experts ahead during a prompt. A prompt batch that routes at least
    /// three quarters of a layer's experts then has every expert of the next MoE layer read
    /// ahead (in file order, behind the layer's own reads, held for that layer, within the cache
    /// budget), so that the disk also reads during the next layer's attention; the output is the
    /// same either way. Off by default: where the disk outruns the compute the layer's own
    /// reads are already hidden, and up to a quarter of these reads go unused (docs/store.md).
    #[arg(long)]
    pub prompt_ahead: bool,

    /// When streaming a model whose router reads the layer's input (SmallThinker): request a
    /// layer's experts after its attention, as for every other model, instead of as soon as
    /// the router has chosen them (before the attention, so that the reads go on while it
    /// computes). For measuring what the early request hides; the output is the same either
    /// way.
    #[arg(long)]
    pub no_early_load: bool,

    /// When streaming: where the dense (non-expert) weights live: `anon` (read into this
    /// process's own memory with O_DIRECT; the file's map is released), `mmap` (the file's map,
    /// faulted in on first use), `warm` (the map, faulted in at load) [default: anon].
    #[arg(long, value_parser = choice::<DenseWeights>(), value_name = "MODE")]
    pub dense_weights: Option<DenseWeights>,

    /// Debug baseline: read every expert of every MoE layer at every forward pass (no cache).
    #[arg(long)]
    pub load_all: bool,

    /// Testing aid: make the reads of one expert fail, as `LAYER:EXPERT` (an I/O error) or
    /// `LAYER:EXPERT:short` (the file ending inside it).
    #[arg(long, value_name = "LAYER:EXPERT[:short]", value_parser = parse_read_fault, hide = true)]
    pub inject_read_fault: Option<ReadFault>,
}

impl StreamArgs {
    /// The runtime's settings these flags make.
    pub fn config(self) -> StreamConfig {
        StreamConfig {
            moe_stream: self.moe_stream,
            cache_mb: self.cache_mb,
            cache_policy: self.cache_policy,
            couple: self.couple,
            couple_k: self.couple_k,
            couple_d: self.couple_d,
            cache_floor_mb: self.cache_floor_mb,
            cache_ceil_mb: self.cache_ceil_mb,
            force_cache: self.force_cache,
            no_odirect: self.no_odirect,
            io_threads: self.io_threads,
            io_backend: self.io_backend,
            overlap: self.overlap,
            prompt_ahead: self.prompt_ahead,
            no_early_load: self.no_early_load,
            dense_weights: self.dense_weights,
            load_all: self.load_all,
            inject_read_fault: self.inject_read_fault,
            prefetch: self.prefetch,
            predict_prefetch: self.predict_prefetch,
            predict_spec_max: self.predict_spec_max,
        }
    }
}

/// A fraction from 0 to 1 (a cache-aware policy's strength, a probability).
fn unit_fraction(s: &str) -> Result<f32, String> {
    let v: f32 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number (0 to 1)"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s} is not between 0 and 1"))
    }
}

/// The cache-aware routing policies (lossy), shared by `run` and `serve`: they consult what
/// the expert cache holds, so they need `--moe-stream on` and a cache.
#[derive(clap::Args, Debug, Clone)]
pub struct CacheAwareArgs {
    /// LOSSY: cache-aware dropping. In a decode step, skip a routed expert that is not in the
    /// expert cache (it would have to be read) and that the router weighted below F x 1/K of
    /// the routing (K: the experts per token in effect): F of the share each expert would get
    /// if the router split its weight evenly. The routing's strongest expert is always kept.
    /// Resident experts are never dropped. From 0 (off) to 1. The `moe-drop:` line and the
    /// CSV's `experts_dropped` say how much it dropped: the flag sets a threshold, not a rate
    /// (docs/lossy.md). Needs --moe-stream on and a cache.
    #[arg(long, value_name = "F", value_parser = unit_fraction, default_value_t = 0.0)]
    pub drop_cold_experts: f32,

    /// With --drop-cold-experts: leave the kept experts' weights as the router gave them
    /// instead of scaling them back to the routing's whole weight.
    #[arg(long, requires = "drop_cold_experts")]
    pub drop_no_renorm: bool,

    /// With --drop-cold-experts: drop in the prompt's passes too (by default only in decode
    /// steps: a cold cache misses nearly everything there, and the same threshold drops far
    /// more of the routing).
    #[arg(long, requires = "drop_cold_experts")]
    pub drop_in_prefill: bool,

    /// LOSSY: cache-aware substitution, λ from 0 (off) to 1. In a decode step, re-rank the
    /// router's scores (log-probabilities under a softmax gating) with every expert already in
    /// the expert cache raised by λ x the token's score range, and run the top K of that
    /// ranking with the weights the router gives them: a cache miss ranked just inside the top
    /// K gives way to a resident expert ranked just outside. Ties keep the router's choice.
    /// The CSV's `experts_substituted` counts the slots moved (docs/lossy.md). Needs
    /// --moe-stream on and a cache.
    #[arg(long, value_name = "λ", value_parser = unit_fraction, default_value_t = 0.0)]
    pub expert_substitute: f32,
}

impl CacheAwareArgs {
    pub fn config(&self) -> engine::CacheAware {
        engine::CacheAware {
            drop_frac: self.drop_cold_experts,
            drop_renorm: !self.drop_no_renorm,
            drop_in_prefill: self.drop_in_prefill,
            substitute: self.expert_substitute,
        }
    }
}

/// Speculative decoding (exact), shared by `run` and `serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding by prompt lookup (exact, not lossy): after each drawn token, find
    /// where the text's last tokens occurred before (in the prompt or the answer so far, the
    /// longest match, the most recent of equals) and run the tokens that followed it with the
    /// drawn one in a single verify pass; every drafted token the model then draws itself is
    /// kept without a pass of its own, the rest are cut from the context. Each row of a verify
    /// pass has a one-token pass's bits, so the answer is the one without --ngram, token for
    /// token (sampled runs too, with the same seed). It pays where the text repeats (code
    /// edits, quotations) and the weights read once serve several tokens; a step without a
    /// match is a plain decode. The `ngram:` lines, the CSV's `mtp_*` keys and `mtp_batch`
    /// column say what it drafted, kept and cost (docs/lossy.md). Not with latent (MLA) or
    /// linear attention, --route-replay, --route-ahead, the cache-aware policies, the route
    /// traces or --predict-log.
    #[arg(long, group = "drafter")]
    pub ngram: bool,

    /// Speculative decoding with the model's own multi-token-prediction (NextN) head (exact,
    /// not lossy): after each drawn token the head, a block of its own fed with the model's
    /// last hidden state and the token, drafts the next ones (each fed back with the head's
    /// hidden state), and the group is verified in one pass as with --ngram: the answer is
    /// the one without --mtp, token for token. Needs a model with a NextN layer and multi-head
    /// attention (GLM-4.5/4.6, `glm4moe`); the head's weights are read from the file as it
    /// runs (its experts are not in the expert cache). The `mtp:` lines say what it drafted,
    /// kept and cost. Refused with the same flags as --ngram.
    #[arg(long, group = "drafter")]
    pub mtp: bool,

    /// With --ngram or --mtp: the most tokens drafted per verify pass, 1 to 8.
    #[arg(long, value_name = "N", requires = "drafter", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=8))]
    pub draft: u32,

    /// With --ngram: the shortest run of the text's last tokens that must recur before it
    /// drafts (higher: fewer, surer drafts) [default: 3].
    #[arg(long, value_name = "N", requires = "ngram",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub ngram_min_match: Option<u32>,

    /// With --mtp: stop drafting at the first token the head gives a probability below P
    /// (0 to 1; 0 always drafts --draft tokens). A draft not made is a head pass and a verify
    /// row not paid for.
    #[arg(long, value_name = "P", requires = "mtp", default_value_t = 0.0,
          value_parser = unit_fraction)]
    pub mtp_p_min: f32,
}

impl SpecArgs {
    pub fn config(&self) -> anyhow::Result<Option<runtime::spec::Spec>> {
        use runtime::spec::{Mtp, Ngram, Spec};
        if self.ngram {
            Ok(Some(Spec::Ngram(Ngram {
                draft: self.draft as usize,
                min_match: self
                    .ngram_min_match
                    .map_or(Ngram::DEFAULT_MIN_MATCH, |n| n as usize),
            })))
        } else if self.mtp {
            if self.ngram_min_match.is_some() {
                anyhow::bail!("--ngram-min-match is --ngram's; --mtp drafts with the model's head");
            }
            Ok(Some(Spec::Mtp(Mtp {
                draft: self.draft as usize,
                p_min: self.mtp_p_min,
            })))
        } else {
            Ok(None)
        }
    }
}

/// The history's flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct HistoryArgs {
    /// The expert-use history to read and update [default: `.coli_usage` next to the model].
    /// A path given here is trusted: a history another engine wrote is used anyway (its
    /// dimensions and format version are still checked).
    #[arg(long, value_name = "PATH", conflicts_with = "no_usage")]
    pub usage_file: Option<PathBuf>,

    /// Neither read nor write an expert-use history.
    #[arg(long)]
    pub no_usage: bool,

    /// Multiply the history's counts by D (0 < D ≤ 1, rounded to whole counts) at every save,
    /// so that old use fades: 0.99 halves a count in about 69 generations; 1 keeps them all
    /// [default: COLI_USAGE_DECAY from the environment, else 1].
    #[arg(long, value_name = "D")]
    pub usage_decay: Option<f64>,

    /// Pin the most used experts in the expert cache at load (read once, never evicted):
    /// `auto` from the history once it holds 5000 selections, `FILE` from that history file
    /// (trusted), `off` [default: off; the environment's PIN=FILE|auto, or AUTOPIN=1, as in
    /// colibri].
    #[arg(long, value_name = "FILE|auto|off")]
    pub pin: Option<PinArg>,

    /// The pinned experts' budget, taken out of the expert cache's [default: half of what
    /// the cache holds beyond one token cycle; PIN_GB from the environment, in GB]. `auto`
    /// never takes the cache below one token cycle.
    #[arg(long, value_name = "MiB")]
    pub pin_mb: Option<u64>,

    /// Seed the forecast eviction policy with the history's counts (as if this run had seen
    /// them), instead of starting from nothing.
    #[arg(long)]
    pub usage_prior: bool,
}

impl HistoryArgs {
    /// The runtime's settings these flags make.
    pub fn config(self) -> HistoryConfig {
        HistoryConfig {
            usage_file: self.usage_file,
            no_usage: self.no_usage,
            usage_decay: self.usage_decay,
            pin: self.pin,
            pin_mb: self.pin_mb,
            usage_prior: self.usage_prior,
        }
    }
}

/// The sampler's flags (`run`, `serve`).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 (or below) samples greedily.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,

    /// Keep only the K most likely tokens; 0 keeps all.
    #[arg(
        long,
        default_value_t = 40,
        value_name = "K",
        allow_negative_numbers = true
    )]
    pub top_k: i32,

    /// Keep the most likely tokens up to this total probability; 1.0 keeps all.
    #[arg(long, default_value_t = 0.95, value_name = "P")]
    pub top_p: f32,

    /// Drop tokens less likely than this fraction of the most likely one; 0 keeps all.
    #[arg(long, default_value_t = 0.05, value_name = "P")]
    pub min_p: f32,

    /// Seed of the sampler; -1 picks one at random (printed on standard error, give it back
    /// to repeat the run).
    #[arg(short, long, default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
}

impl SamplingArgs {
    /// The runtime's settings these flags make.
    pub fn config(&self) -> runtime::open::Sampling {
        runtime::open::Sampling {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
        }
    }
}
