//! The `sluice` command line.
//!
//! Argument parsing and output only: the work is done by the library crates.

mod analyze;
mod analyze_pairs;
mod analyze_route;
mod analyze_trace;
mod analyze_view;
mod args;
mod bench;
mod genmodel;
mod inspect;
mod lines;
mod logits;
mod moefy;
mod npy;
mod plot;
mod ppl;
mod progress;
mod quantize;
mod refusal;
mod run;
mod serve;
mod session;
mod template;
mod tokenize;
mod upcycle;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run Mixture-of-Experts language models larger than RAM on CPUs.
#[derive(Parser, Debug)]
#[command(name = "sluice", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show what a GGUF model file holds: architecture, metadata, tensor table.
    ///
    /// The whole header is validated first; a malformed file is reported with the key,
    /// tensor or byte offset at fault. A split model is given by its first shard
    /// (`name-00001-of-0000N.gguf`); the other shards are found next to it.
    Inspect(InspectArgs),
    /// Turn text into token ids with a model's tokenizer (the same ids llama.cpp produces).
    ///
    /// Prints the ids as one JSON array on one line. Only the file's metadata is read, so a
    /// vocabulary-only GGUF works as well as a full model.
    Tokenize(TokenizeArgs),
    /// Render a conversation with the model's own chat template, as the model will see it.
    ///
    /// The template (`tokenizer.chat_template`, or a named `tokenizer.chat_template.<name>`) is
    /// rendered with Hugging Face transformers' semantics. The output is exactly the rendered
    /// text (no newline added). `--info` instead tells how the model's reasoning is delimited
    /// and how a request not to reason is honoured (`think_ctl`: template, prefill or none).
    Template(TemplateArgs),
    /// Turn a dense model into a Mixture-of-Experts model whose experts are copies of its
    /// feed-forward network, so that its output equals the dense model's.
    ///
    /// Dense `llama` becomes `llama` with experts (the Mixtral layout) with a small random
    /// router (llama renormalizes the top-k weights, so any router gives the dense output);
    /// `qwen2` becomes `qwen2moe`, which needs --experts = 2 × --top-k, a zero router and a
    /// shared expert behind a zero gate (half routed, half shared). Weights are copied as they
    /// are (any quantization); the output is written streaming.
    Upcycle(UpcycleArgs),
    /// Split a dense model's feed-forward networks into experts with a router fitted on
    /// calibration text (MoEfication), so that real text routes through real weights.
    ///
    /// Runs the model over the calibration text with sluice's forward pass, recording each
    /// layer's FFN input and activation; groups each FFN's neurons into E experts of equal size
    /// (balanced k-means on the gate rows or on the activations); fits each layer's router by
    /// least squares from the FFN input to each group's share of the output; and writes `llama`
    /// with experts (from llama), `qwen2moe` (from qwen2) or `qwen3moe` (from qwen3). The
    /// gating keeps the dense output: at --top-k = --experts the model computes the dense FFN
    /// (up to the order of sums, F16 `down` weights and the 8-bit activation rounding of a
    /// quantized model), below it only the left-out groups are lost. See docs/moefy.md.
    Moefy(MoefyArgs),
    /// Quantize a float model (F32, F16 or BF16 weights) to a llama.cpp file type such as Q4_K_M.
    ///
    /// The output is byte for byte the file llama.cpp's quantizer (release v0.4.0, default
    /// settings, no importance matrix) writes: the same type per tensor (the file type's mix:
    /// norms, routers and other vectors stay as they are, output.weight gets Q6_K, attn_v and
    /// ffn_down get more bits in some layers, ...), the same blocks, metadata and layout. See
    /// docs/quantize.md. One progress line per tensor goes to standard error.
    Quantize(QuantizeArgs),
    /// Generate text from a prompt, streamed to standard output, then the run summary.
    ///
    /// Standard output gets the generated text as it arrives (with --progress: a
    /// `BMOE_PROGRESS` line per token, then `=== answer ===`, the whole answer and
    /// `=== perf ===`), then the summary: `generation: <n> tokens, <s> s/token (<t> tok/s)`
    /// (decode time only: the forward passes of the generated tokens), `compute:` (CPU
    /// occupancy, major faults), `mode:`, and when streaming `moe-stream:` and `moe-cache:`
    /// (BigMoeOnEdge's telemetry contract, docs/telemetry.md). Diagnostics (the
    /// seed, prompt size and prefill time) go to standard error, and so does the reasoning of a
    /// reasoning model run with --chatml, between `--- reasoning ---` and
    /// `--- end of reasoning ---` lines; the answer holds only the text outside the reasoning. Generation stops at an end-of-generation token, after -n
    /// tokens, or when the context is full. Sampling is llama.cpp's default chain (top-k,
    /// top-p, min-p, temperature, seeded draw) with its defaults; --temp 0 is greedy.
    Run(Box<RunArgs>),
    /// Serve the model over HTTP: an OpenAI-compatible API and a live telemetry dashboard.
    ///
    /// One model stays loaded (the expert cache warm across requests) and one generation runs
    /// at a time; other requests wait in a bounded FIFO (--queue) and are refused with 429 past
    /// it. Endpoints: `POST /v1/chat/completions` (the model's chat template; `stream`, stop
    /// sequences, sampling fields, `reasoning_content` apart from the answer),
    /// `POST /v1/completions` (a raw prompt), `GET /v1/models`, `GET /health`,
    /// `GET /v1/telemetry` and `GET /v1/telemetry/events` (per-token time split and reads), and
    /// the dashboard at `/`. A conversation sent again with a new message re-uses the context's
    /// matching prefix. A client that disconnects cancels its request. Binds 127.0.0.1 unless
    /// --host says otherwise; docs/serve.md.
    Serve(Box<ServeArgs>),
    /// Write the logits of every prompt position to a numpy .npy file.
    ///
    /// The output is float32, C order, shape [n_tokens, n_vocab]: row i holds the logits after
    /// token i. No chat template is applied: -p is tokenized with the BOS the model's metadata
    /// asks for (special-token text not parsed); --tokens runs exactly the ids given.
    Logits(LogitsArgs),
    /// Write a synthetic model shaped like a real one (architecture, tensor names, shapes and
    /// per-tensor quantization types), filled with random but valid blocks, for benchmarks.
    ///
    /// The file is written streaming (bounded memory) at disk speed, via OUT.part. The weights
    /// are noise: the model produces gibberish, but exactly the real model's work and bytes.
    /// --router-skew makes some experts more popular than others, as trained routers do.
    GenModel(genmodel::GenModelArgs),
    /// Run sluice and llama.cpp side by side on one model: alternating runs (A B A B), each
    /// with the model evicted from the page cache, optionally under a cgroup v1 memory cap,
    /// next to a direct-I/O and a DRAM calibration; prints (and appends) a markdown report.
    ///
    /// Per run: prefill and decode tok/s (each engine's own timings), the decode ratio, MiB
    /// read per token (block-layer reads of the whole run), hit %, peak RSS and the physical
    /// bound min(disk ÷ missed bytes, DRAM ÷ touched bytes) with the share of it achieved.
    /// llama.cpp's llama-completion comes from scripts/build_llamacpp.sh or --llama-bin.
    Bench(bench::BenchArgs),
    /// Offline analyses of recorded runs (`analyze replay TRACE.csv --budget-mb ...`).
    Analyze(analyze::AnalyzeArgs),
}

/// KV cache storage type.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum KvTypeArg {
    /// 16-bit floats (llama.cpp's default).
    F16,
    /// 32-bit floats.
    F32,
}

impl KvTypeArg {
    fn engine(self) -> engine::ops::KvType {
        match self {
            KvTypeArg::F16 => engine::ops::KvType::F16,
            KvTypeArg::F32 => engine::ops::KvType::F32,
        }
    }
}

#[derive(clap::Args, Debug)]
struct InspectArgs {
    /// The GGUF file to inspect. Without it, the small demo model built into the binary is
    /// inspected (random weights, qwen3moe layout).
    model: Option<PathBuf>,

    /// Print one JSON document instead of text (arrays summarized the same way).
    #[arg(long)]
    json: bool,

    /// How many leading elements of each metadata array to show (the length is always shown).
    #[arg(long, default_value_t = 8, value_name = "N")]
    array_items: usize,

    /// Dequantize this tensor to float32 and write it to the file given with --out.
    #[arg(long, value_name = "NAME", requires = "out")]
    tensor: Option<String>,

    /// Where --tensor writes its values: a numpy .npy file (little-endian float32, shape in
    /// numpy order, i.e. the GGUF dims reversed).
    #[arg(long, value_name = "FILE.npy", requires = "tensor")]
    out: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct TokenizeArgs {
    /// The text to tokenize (or use --file).
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    text: Option<String>,

    /// The GGUF model (or vocabulary-only) file whose tokenizer to use. Without it, the small
    /// demo model built into the binary is used.
    #[arg(short, long, value_name = "MODEL")]
    model: Option<PathBuf>,

    /// Read the text from this file instead (`-` for standard input); it is used as is,
    /// newlines included.
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,

    /// Turn special-token text such as `<s>` or `<|im_start|>` into that token's id instead of
    /// tokenizing its characters.
    #[arg(long)]
    special: bool,

    /// Do not add the BOS/EOS tokens the model's metadata asks for.
    #[arg(long)]
    no_bos: bool,

    /// Print one line per token instead: the id, a tab, and the token's text as a JSON string
    /// (special tokens shown as their text; bytes that are not valid UTF-8 on their own shown
    /// as U+FFFD).
    #[arg(long)]
    pieces: bool,

    /// Tokenize the text as one user message of a chat: rendered with the model's own chat
    /// template (`tokenizer.chat_template`) up to the opening of the assistant's turn, special
    /// tokens parsed. A model without a chat template is an error.
    #[arg(long)]
    chatml: bool,

    /// With --chatml: a system message before the user's.
    #[arg(long, value_name = "TEXT", requires = "chatml")]
    system: Option<String>,

    /// With --chatml: ask the model not to reason, the way its template allows (an
    /// `enable_thinking` flag, or a reasoning section started already closed).
    #[arg(long, requires = "chatml")]
    no_think: bool,
}

#[derive(clap::Args, Debug)]
struct TemplateArgs {
    /// The GGUF model (or vocabulary-only) file. Without it, the built-in demo model is used
    /// (it has no chat template, so only the error can be seen).
    #[arg(short, long, value_name = "MODEL")]
    model: Option<PathBuf>,

    /// Use the named template `tokenizer.chat_template.<NAME>` instead of the default one.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,

    /// A one-message conversation: this user prompt.
    #[arg(short, long, value_name = "PROMPT", conflicts_with = "messages")]
    prompt: Option<String>,

    /// With -p: a system message before the user's.
    #[arg(long, value_name = "TEXT", requires = "prompt")]
    system: Option<String>,

    /// The conversation as a JSON array of messages (`role`, `content`, and where used
    /// `reasoning_content`, `tool_calls`, `tool_call_id`), `-` for standard input.
    #[arg(long, value_name = "FILE.json")]
    messages: Option<PathBuf>,

    /// Tool definitions, a JSON array (`[{"type":"function","function":{...}}]`), passed to
    /// the template as `tools`.
    #[arg(long, value_name = "FILE.json")]
    tools: Option<PathBuf>,

    /// Ask the model not to reason, the way its template allows (`enable_thinking` false, or
    /// the reasoning section started already closed for formats such as gpt-oss's).
    #[arg(long)]
    no_think: bool,

    /// Render the conversation as finished, without opening the assistant's turn.
    #[arg(long)]
    no_generation_prompt: bool,

    /// Print `{"think_ctl": ..., "reasoning": ...}` as JSON instead of a rendering.
    #[arg(long)]
    info: bool,
}

#[derive(clap::Args, Debug)]
struct UpcycleArgs {
    /// The dense GGUF model (`llama` or `qwen2`).
    input: PathBuf,

    /// Where to write the MoE model.
    #[arg(long, value_name = "MOE.gguf")]
    out: PathBuf,

    /// Number of experts per layer.
    #[arg(long, default_value_t = 8, value_name = "E")]
    experts: u32,

    /// Experts used per token.
    #[arg(long, default_value_t = 2, value_name = "K")]
    top_k: u32,

    /// Spread of the random router weights (uniform in ±scale/sqrt(n_embd)); 0 gives equal
    /// routing probabilities. Ignored for qwen2, whose router must be zero.
    #[arg(long, default_value_t = 0.5, value_name = "SCALE")]
    router_scale: f32,

    /// Seed of the router weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(clap::Args, Debug)]
struct MoefyArgs {
    /// The dense GGUF model (`llama`, `qwen2` or `qwen3`; SwiGLU FFNs).
    input: PathBuf,

    /// Where to write the MoE model (via OUT.tmp, renamed when complete).
    #[arg(long, value_name = "MOE.gguf")]
    out: PathBuf,

    /// Experts per layer: each FFN's neurons are split into E groups of equal size (E must
    /// divide the FFN width).
    #[arg(long, default_value_t = 16, value_name = "E")]
    experts: u32,

    /// Experts used per token (the file's expert_used_count; the experts' down matrices are
    /// scaled for it, so run the file with this K). Quality falls fast below E: see the
    /// table in docs/moefy.md.
    #[arg(long, default_value_t = 12, value_name = "K")]
    top_k: u32,

    /// Calibration text [default: Moby-Dick chapters 1-2, built in].
    #[arg(long, value_name = "FILE")]
    calib: Option<PathBuf>,

    /// Calibration as token ids (whitespace-separated) instead of a text, for models without a
    /// tokenizer.
    #[arg(long, value_name = "FILE", conflicts_with = "calib")]
    calib_ids: Option<PathBuf>,

    /// Calibration tokens at most (memory: 4 × tokens × (n_embd + n_ff) bytes per layer).
    #[arg(long, default_value_t = 2048, value_name = "N")]
    calib_tokens: usize,

    /// Tokens per calibration forward pass (each starts a fresh context with the BOS).
    #[arg(long, default_value_t = 512, value_name = "N")]
    chunk: usize,

    /// How neurons are grouped: `gate` (balanced k-means on the gate rows) or `activation`
    /// (on their activation magnitudes over the calibration tokens).
    #[arg(long, default_value = "activation", value_parser = parse_grouping)]
    grouping: transform::moefy::Grouping,

    /// Spread (standard deviation within a token) of the router logits: small, so that the
    /// routing weights stay near uniform while the ranking is the fitted one.
    #[arg(long, default_value_t = 1e-3, value_name = "S")]
    router_scale: f32,

    /// Type of the experts' down matrices (f32, f16, q8_0, ...) [default: F32 for an F32
    /// model, else F16: down is split along its rows, which no block format allows without
    /// requantizing].
    #[arg(long, value_name = "TYPE", value_parser = parse_ggml_type)]
    down_type: Option<gguf::GgmlType>,

    /// Seed of the k-means start (and of qwen2moe's shared-expert gate).
    #[arg(long, default_value_t = 0)]
    seed: u64,

    /// Threads for the calibration and the fitting [default: every core available to the
    /// process]; the file written does not depend on it.
    #[arg(short, long, value_name = "N")]
    threads: Option<usize>,

    /// Only the final line.
    #[arg(long)]
    quiet: bool,
}

fn parse_grouping(s: &str) -> Result<transform::moefy::Grouping, String> {
    transform::moefy::Grouping::from_name(s)
        .ok_or_else(|| format!("`{s}` is not a grouping (gate, activation)"))
}

fn parse_ggml_type(s: &str) -> Result<gguf::GgmlType, String> {
    (0..64)
        .filter_map(gguf::GgmlType::from_id)
        .find(|t| t.name().eq_ignore_ascii_case(s))
        .ok_or_else(|| format!("`{s}` is not a ggml type name (f32, f16, q8_0, ...)"))
}

#[derive(clap::Args, Debug)]
struct QuantizeArgs {
    /// The model to quantize (GGUF; a split model: its first shard).
    input: PathBuf,

    /// Where to write the quantized model. It is written to OUT.tmp first and renamed when
    /// complete, so an error never leaves a partial file.
    out: PathBuf,

    /// The file type: the default tensor type and its mix of more-bits tensors (names as in
    /// llama.cpp, any case; Q4_K, Q5_K and Q3_K mean the _M variants). In every type but
    /// Q8_0, output.weight gets Q6_K; models with exactly 8 experts get Q8_0 attn_v and attn_k.
    #[arg(long = "type", value_parser = args::file_type(), ignore_case = true, value_name = "TYPE")]
    ftype: transform::quantize::FileType,

    /// Allow converting tensors that are already quantized (they are dequantized first, which
    /// compounds the rounding errors). Without it such a model is refused, unless every
    /// tensor already has its target type (then it is copied).
    #[arg(long)]
    allow_requantize: bool,

    /// Give every quantized tensor the file type's default type (no mix; output.weight and
    /// token_embd too). Row lengths that do not fit still fall back.
    #[arg(long)]
    pure: bool,

    /// Threads quantizing the rows of a tensor [default: every core available to the
    /// process]. The output does not depend on it.
    #[arg(short, long, value_name = "N")]
    threads: Option<usize>,

    /// No progress lines (warnings and errors are still printed).
    #[arg(short, long)]
    quiet: bool,
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// The GGUF model file (a split model: its first shard).
    #[arg(short, long, value_name = "MODEL")]
    model: PathBuf,

    /// The address to listen on. Anything but a loopback address exposes the server (and the
    /// model) to the network: set --api-key then.
    #[arg(long, default_value = "127.0.0.1", value_name = "HOST")]
    host: String,

    /// The port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080, value_name = "PORT")]
    port: u16,

    /// Require `Authorization: Bearer KEY` on every `/v1/...` request [default: the
    /// environment's SLUICE_API_KEY, else no key]. The page at `/` asks for it.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,

    /// Generation requests that may wait while one runs; more are refused with 429.
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=4096))]
    queue: u64,

    /// Largest request body accepted, in KiB (413 past it).
    #[arg(long, default_value_t = 4096, value_name = "KiB")]
    max_body_kb: usize,

    /// Connections open at once; more are answered 503.
    #[arg(long, default_value_t = 64, value_name = "N")]
    max_connections: usize,

    /// The model's name in `/v1/models` and in responses [default: the file name without
    /// `.gguf`].
    #[arg(long, value_name = "NAME")]
    alias: Option<String>,

    /// Most tokens a request generates when it gives no `max_tokens`; -1: until an
    /// end-of-generation token, a stop sequence or a full context.
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = -1,
        value_name = "N",
        allow_negative_numbers = true
    )]
    n_predict: i64,

    /// Context size in tokens (prompt + generated); 0 means the model's training context
    /// [default: 4096, or the training context when smaller].
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    ctx: Option<usize>,

    /// A system message for conversations that bring none.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,

    /// Ask a reasoning model not to reason unless a request says otherwise
    /// (`chat_template_kwargs.enable_thinking`, `reasoning_effort`).
    #[arg(long)]
    no_think: bool,

    /// LOSSY: route every MoE layer to K experts instead of the model's own count, for every
    /// request, as `sluice run --n-expert-used` does (docs/lossy.md); `/v1/telemetry`'s
    /// `info.n_expert_used` and `info.mode` say so.
    #[arg(long, value_name = "K")]
    n_expert_used: Option<u32>,

    /// As `sluice run`'s, for every request (`/v1/telemetry`'s `info.mode` names them).
    #[command(flatten)]
    cache_aware: args::CacheAwareArgs,

    /// As `sluice run`'s, for every request.
    #[command(flatten)]
    spec: args::SpecArgs,

    #[command(flatten)]
    engine: EngineArgs,

    /// Sampling for requests that leave a field out (a request's `temperature`, `top_p`,
    /// `top_k`, `min_p`, `seed` override them).
    #[command(flatten)]
    sampling: args::SamplingArgs,

    #[command(flatten)]
    stream: args::StreamArgs,

    #[command(flatten)]
    history: args::HistoryArgs,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The GGUF model file (a split model: its first shard). Required: the built-in demo
    /// model is only for `inspect`, `tokenize` and `template` (it is in
    /// crates/cli/assets/demo-qwen3moe.gguf of the source tree, to run it give that path).
    #[arg(short, long, value_name = "MODEL")]
    model: PathBuf,

    /// The prompt (with --chatml: the user's message). Not used with --session (prompts
    /// come as requests) or --ppl.
    #[arg(
        short,
        long,
        value_name = "PROMPT",
        required_unless_present_any = ["session", "ppl", "messages"],
        conflicts_with_all = ["session", "ppl", "messages"]
    )]
    prompt: Option<String>,

    /// With --chatml: run a whole conversation instead of one prompt — a JSON array of
    /// messages (`role`, `content`), rendered with the template up to the opening of the
    /// assistant's next turn (`-` reads standard input).
    #[arg(
        long,
        value_name = "FILE.json",
        requires = "chatml",
        conflicts_with = "session"
    )]
    messages: Option<std::path::PathBuf>,

    /// Keep the model loaded and serve requests: one JSON object per line on standard input
    /// (`{"cmd":"generate","id":1,"prompt":"...","n_predict":64,"think":false,"clear_kv":true}`,
    /// `decide`, `cancel`, `close`; the end of the input closes), answered with `BMOE_READY`,
    /// `BMOE_BEGIN`, per-token `BMOE_LOAD`/`BMOE_PROGRESS`, `BMOE_DONE`, `BMOE_DECIDE` and
    /// `BMOE_ERROR` lines on standard output (BigMoeOnEdge's session protocol, docs/session.md). The
    /// expert cache stays warm across requests; `clear_kv:false` continues the chat, re-using
    /// the context's tokens that the re-rendered history still starts with; `cancel` stops the
    /// generation in flight and rolls its turn back.
    #[arg(long)]
    session: bool,

    /// With --session: answer `decide` requests (which of a list of choices the model would
    /// answer next, scored from one prefill; nothing is decoded).
    #[arg(long, requires = "session")]
    decide: bool,

    /// With --decide: keep the context's state after a decision's prefix, and restore it when
    /// the next decision's prefix is the same or extends it (auto: on, as for any CPU prefill).
    #[arg(long, value_parser = args::choice::<runtime::decide::PrefixCacheMode>(), default_value_t = runtime::decide::PrefixCacheMode::Auto, value_name = "MODE")]
    decide_prefix_cache: runtime::decide::PrefixCacheMode,

    /// Score a text instead of generating: the perplexity of FILE's text (BOS, no template)
    /// under the model, teacher-forced, and the next-token hit rate (how often the most likely
    /// token was the text's). The whole text must fit the context (-c).
    #[arg(long, value_name = "FILE", conflicts_with = "session")]
    ppl: Option<std::path::PathBuf>,

    /// With --ppl: one token per forward pass, as decode runs, so that what depends on the
    /// expert cache's state (a streaming run's reads, hits) is measured as in a generation; a
    /// single prefill routes every position of a layer before reading any.
    #[arg(long, requires = "ppl")]
    ppl_step: bool,

    /// With --ppl: write each scored position's most likely next token to FILE, one token id
    /// per line, in order (a lossy setting's next-token agreement with the baseline is counted
    /// on two such files: scripts/lossy_cache_aware.sh).
    #[arg(long, value_name = "FILE", requires = "ppl")]
    ppl_predictions: Option<std::path::PathBuf>,

    /// Diagnostic: colibri's routing stream (its routing telemetry contract, docs/history.md,
    /// "The routing stream"): one line per MoE layer call and batch row, `<call> <row> <layer>` then
    /// ` <expert>:<gate>` per routed expert (gates as applied, 4 decimals). The environment
    /// variable ROUTE_TRACE=PATH does the same (a file it names that cannot be created is a
    /// warning, as in colibri).
    #[arg(long, value_name = "PATH")]
    route_trace_stream: Option<std::path::PathBuf>,

    /// Test hook of --session: the first prefill chunk K (`prefill:K`, 0-based) or the forward
    /// pass of generated token K (`decode:K`) waits there for a cancel request.
    #[arg(long, value_name = "WHERE", hide = true, requires = "session")]
    test_hold: Option<runtime::cancel::Hold>,

    /// Most tokens to generate; -1 means until an end-of-generation token or a full context.
    #[arg(
        short = 'n',
        long = "n-predict",
        visible_alias = "predict",
        default_value_t = 256,
        value_name = "N",
        allow_negative_numbers = true
    )]
    n_predict: i64,

    /// Context size in tokens (prompt + generated); 0 means the model's training context
    /// [default: 4096, or the training context when smaller].
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    ctx: Option<usize>,

    #[command(flatten)]
    engine: EngineArgs,

    #[command(flatten)]
    sampling: args::SamplingArgs,

    /// Never draw an end-of-generation token: generate exactly -n tokens (or until the
    /// context is full).
    #[arg(long)]
    ignore_eos: bool,

    /// Run the prompt as one user message of a chat, rendered with the model's own chat
    /// template (`tokenizer.chat_template`) up to the opening of the assistant's turn. A model
    /// without a chat template is an error.
    #[arg(long)]
    chatml: bool,

    /// With --chatml: a system message before the user's.
    #[arg(long, value_name = "TEXT", requires = "chatml")]
    system: Option<String>,

    /// With --chatml: ask the model not to reason, the way its template allows.
    #[arg(long, requires = "chatml")]
    no_think: bool,

    /// Diagnostic (a traced run is not a benchmark run): write the routing of every MoE layer
    /// (prompt and generated tokens) to PATH as a `route_trace v1` file
    /// (docs/telemetry.md): one row per routed expert with its weight, whether the expert
    /// cache had it and the bytes its read took (a resident run: every row a hit of 0 bytes).
    #[arg(long, value_name = "PATH")]
    route_trace: Option<PathBuf>,

    /// Diagnostic: route every generated token's MoE layers to the experts a recorded
    /// `route_trace v1` file routed at its decode steps (step by step, layer by layer, wrapping
    /// around after the last), so that this model sees that model's expert access pattern. The
    /// weights are this model's router probabilities of those experts. The prompt is routed
    /// normally. The `mode:` line says the run was replayed.
    #[arg(long, value_name = "TRACE.csv")]
    route_replay: Option<PathBuf>,

    /// Machine-readable progress (docs/telemetry.md): for every generated token a
    /// `BMOE_LOAD {...}` line when experts were read and a `BMOE_PROGRESS {...}` line (time
    /// split, reads, cache hit rate, faults, CPU, dense residency, the token's text), instead
    /// of the text streamed inline; then `=== answer ===`, the whole answer, `=== perf ===` and
    /// the summary lines.
    #[arg(long)]
    progress: bool,

    /// Write the run's metrics to PATH as CSV (`# bmoe_metrics v2`: a preamble of the resolved
    /// configuration, one row per generated token with its time split, reads, cache, faults,
    /// CPU and memory picture, and a `# summary` trailer).
    #[arg(long, value_name = "PATH")]
    csv: Option<PathBuf>,

    /// Diagnostic (a traced run is not a benchmark run): write every read of the expert store
    /// to PATH (`# io_trace v1`: layer, expert, part, lane, offset, requested and read bytes,
    /// latency). Needs a streaming run.
    #[arg(long, value_name = "PATH")]
    io_trace: Option<PathBuf>,

    /// Diagnostic (a traced run is not a benchmark run): write the time of every step of the
    /// forward pass to PATH (`# compute_trace v1`): one row per named intermediate (llama.cpp's
    /// graph names: attn_norm-0, Qcur-0, ..., result_output) with the wall time since the
    /// previous one and the major faults in between. Works with or without streaming.
    #[arg(long, value_name = "PATH", conflicts_with = "compute_trace_layers")]
    compute_trace: Option<PathBuf>,

    /// As --compute-trace, one row per layer (`blk.<il>`, and `post` for the output head).
    #[arg(long, value_name = "PATH")]
    compute_trace_layers: Option<PathBuf>,

    /// Diagnostic (an instrumented run, not a benchmark run): on every decode routing, score
    /// how much of it three predictors named before the layer ran — the stale gate (the layer's
    /// router applied to the previous MoE layer's FFN input), the previous token's routing, and
    /// a control (the layer's own router through the same ranking path, which must read 100%)
    /// — and print two `moe-predict:` lines and a per-layer table (docs/predict.md). Changes
    /// nothing that is computed or read.
    #[arg(long)]
    predict_log: bool,

    /// LOSSY: commit each decode layer's expert selection to its router's ranking on the FFN
    /// input N MoE layers earlier (the experts weighted by the layer's own router), so that the
    /// experts are known, and read, N layers before they are needed. The output differs from
    /// the model's: the `moe-route-ahead:` line says on how many slots the committed selection
    /// agreed with the router. 0 is off (docs/predict.md).
    #[arg(long, default_value_t = 0, value_name = "N")]
    route_ahead: usize,

    /// LOSSY: route each token to K experts in every MoE layer instead of the model's own
    /// count (its `expert_used_count`): the K best of the router's ranking, their weights
    /// normalized over those K where the model normalizes them. Fewer experts read and
    /// multiplied per token, a different output; reproducible (the same K gives the same
    /// tokens, streamed or resident). K equal to the model's count is the baseline. The
    /// effective K is the one the `mode:` line, the CSV preamble and `cache_cycle_mb` report.
    #[arg(long, value_name = "K")]
    n_expert_used: Option<u32>,

    #[command(flatten)]
    cache_aware: args::CacheAwareArgs,

    #[command(flatten)]
    spec: args::SpecArgs,

    #[command(flatten)]
    stream: args::StreamArgs,

    #[command(flatten)]
    history: args::HistoryArgs,
}

#[derive(clap::Args, Debug)]
struct LogitsArgs {
    /// The GGUF model file. Required (the built-in demo model cannot be run from memory; it
    /// is crates/cli/assets/demo-qwen3moe.gguf in the source tree).
    #[arg(short, long, value_name = "MODEL")]
    model: PathBuf,

    /// The text to run (BOS added as the model's metadata says; no template).
    #[arg(
        short,
        long,
        value_name = "PROMPT",
        required_unless_present = "tokens",
        conflicts_with = "tokens"
    )]
    prompt: Option<String>,

    /// Token ids to run, exactly as given, comma-separated (`1,2,3`).
    #[arg(long, value_name = "IDS", value_delimiter = ',', num_args = 1..)]
    tokens: Option<Vec<u32>>,

    /// Where to write the logits (.npy, float32, shape [n_tokens, n_vocab]).
    #[arg(long, value_name = "FILE.npy")]
    out: PathBuf,

    /// Context size in tokens [default: the number of tokens run].
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    ctx: Option<usize>,

    /// Also write the forward pass's named intermediates, under llama.cpp's graph names
    /// (attn_norm, Qcur, Kcur, Vcur, kqv_out, attn_out, ffn_inp, ffn_norm, ffn_moe_logits,
    /// ffn_moe_probs, ffn_moe_topk, ffn_moe_weights, ffn_moe_out, ffn_shexp_out, ffn_out, l_out,
    /// result_norm, result_output), one .npy per name and layer into DIR: `NAME-LAYER.npy`
    /// (`NAME.npy` for the final norm and output), float32 [n_tokens, width]. Qcur and Kcur are
    /// after RoPE, as llama.cpp's last tensors of those names.
    #[arg(long, value_name = "DIR")]
    dump: Option<PathBuf>,

    /// With --dump: only these names (comma-separated) [default: every name].
    #[arg(long, value_name = "NAMES", value_delimiter = ',', requires = "dump")]
    dump_names: Option<Vec<String>>,

    /// Only the last position's logits (shape [1, n_vocab]), computed as a generation or a
    /// session's decision computes them: as llama.cpp, the last layer then runs on that one
    /// row, so the bits can differ from the last row of the full matrix.
    #[arg(long, conflicts_with = "dump")]
    last: bool,

    /// LOSSY: route every MoE layer to K experts instead of the model's own count, as
    /// `sluice run --n-expert-used` does (docs/lossy.md).
    #[arg(long, value_name = "K")]
    n_expert_used: Option<u32>,

    #[command(flatten)]
    engine: EngineArgs,

    #[command(flatten)]
    stream: args::StreamArgs,
}

/// How the forward pass runs (shared by `run` and `logits`).
#[derive(clap::Args, Debug)]
struct EngineArgs {
    /// Compute threads [default: every core available to the process].
    #[arg(short, long, value_name = "N")]
    threads: Option<usize>,

    /// Most prompt tokens processed in one batch.
    #[arg(
        long,
        visible_alias = "ubatch-size",
        default_value_t = 512,
        value_name = "N"
    )]
    ubatch: usize,

    /// KV cache storage type (f32 for comparisons against a float32 reference).
    #[arg(long, value_enum, default_value_t = KvTypeArg::F16)]
    kv_type: KvTypeArg,

    /// Software prefetch of weight rows ahead of the matrix kernels: `auto` as the kernel
    /// table chose for each weight (on, except for kernels that prefetch their own rows), and
    /// for the one-token products of a model of 256 MiB or more as measured at start-up for
    /// each weight type and order (see `--multi-row`; off where leaving it out streams more
    /// than 5 % faster); `on` or `off` for every matrix. The output is the same bit for bit;
    /// only the speed changes (docs/performance.md).
    #[arg(long, value_enum, default_value_t = RowPrefetchArg::Auto)]
    row_prefetch: RowPrefetchArg,

    /// The multi-row matrix kernels (a group of weight rows per call) in one-token products:
    /// `auto` measures at start-up which way streams weights faster on this CPU, for each
    /// weight type and summation order the model's matrices use (about 0.1-0.4 s each, for
    /// models of 256 MiB or more; smaller ones keep several rows; on an AMD EPYC Zen 4 one row
    /// streamed Q4_K twice as fast, several rows Q4_0), and, where one row wins, whether the
    /// row prefetch pays (as it measures for the types without multi-row kernels unless
    /// `--row-prefetch` is given); `on` or `off` for every matrix. The output is the same bit
    /// for bit either way (docs/performance.md).
    #[arg(long, value_enum, default_value_t = RowPrefetchArg::Auto)]
    multi_row: RowPrefetchArg,
}

/// `--row-prefetch`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum RowPrefetchArg {
    Auto,
    On,
    Off,
}

impl RowPrefetchArg {
    fn setting(self) -> Option<bool> {
        match self {
            RowPrefetchArg::Auto => None,
            RowPrefetchArg::On => Some(true),
            RowPrefetchArg::Off => Some(false),
        }
    }
}

/// Output piped into a reader that stops early (`sluice analyze ... | head`) ends the process
/// quietly, as for other command-line tools, instead of a panic on the failed write.
fn quiet_broken_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE at start-up, before any other
    // thread exists, touches no memory of ours.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// What `run` and `serve` configure alike: the model, its streaming, the expert-use history,
/// the engine and the sampling (each adds its own on top).
fn base_run_config(
    model: std::path::PathBuf,
    history: &args::HistoryArgs,
    stream: &args::StreamArgs,
    engine: &EngineArgs,
    ctx: Option<usize>,
    sampling: &args::SamplingArgs,
) -> anyhow::Result<runtime::open::RunConfig> {
    let mut run = runtime::open::RunConfig::new(model);
    run.history = history.clone().config().with_env()?;
    run.stream = stream.clone().config();
    run.threads = engine.threads;
    run.ctx = ctx;
    run.ubatch = engine.ubatch;
    run.row_prefetch = engine.row_prefetch.setting();
    run.multi_row = engine.multi_row.setting();
    run.kv_type = engine.kv_type.engine();
    run.sampling = sampling.config();
    Ok(run)
}

fn main() -> ExitCode {
    quiet_broken_pipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&inspect::Options {
            model: args.model,
            json: args.json,
            array_items: args.array_items,
            tensor: args.tensor,
            out: args.out,
        }),
        Command::Tokenize(args) => tokenize::run(&tokenize::Options {
            model: args.model,
            text: args.text,
            file: args.file,
            special: args.special,
            no_bos: args.no_bos,
            pieces: args.pieces,
            chatml: args.chatml,
            system: args.system,
            no_think: args.no_think,
        }),
        Command::Template(args) => template::run(&template::Options {
            model: args.model,
            name: args.name,
            prompt: args.prompt,
            system: args.system,
            messages: args.messages,
            tools: args.tools,
            no_think: args.no_think,
            no_generation_prompt: args.no_generation_prompt,
            info: args.info,
        }),
        Command::Upcycle(args) => upcycle::run(&transform::upcycle::Options {
            input: args.input,
            out: args.out,
            experts: args.experts,
            top_k: args.top_k,
            router_scale: args.router_scale,
            seed: args.seed,
        }),
        Command::Moefy(args) => moefy::run(&moefy::Options {
            moefy: transform::moefy::Options {
                input: args.input,
                out: args.out,
                experts: args.experts,
                top_k: args.top_k,
                grouping: args.grouping,
                router_scale: args.router_scale,
                down_type: args.down_type,
                seed: args.seed,
                threads: runtime::load::thread_count(args.threads),
            },
            calib: args.calib,
            calib_ids: args.calib_ids,
            calib_tokens: args.calib_tokens,
            chunk: args.chunk,
            threads: args.threads,
            quiet: args.quiet,
        }),
        Command::Quantize(args) => quantize::run(
            &transform::quantize::Options {
                input: args.input,
                out: args.out,
                ftype: args.ftype,
                allow_requantize: args.allow_requantize,
                pure: args.pure,
                threads: args.threads,
            },
            args.quiet,
        ),
        Command::Run(args) => base_run_config(
            args.model.clone(),
            &args.history,
            &args.stream,
            &args.engine,
            args.ctx,
            &args.sampling,
        )
        .and_then(|mut run| {
            run.token_figures = args.progress || args.session || args.csv.is_some();
            run.ignore_eos = args.ignore_eos;
            run.chatml = args.chatml;
            run.route_trace = args.route_trace;
            run.route_replay = args.route_replay;
            run.route_stream = args
                .route_trace_stream
                .map(|path| (path, false))
                .or_else(|| {
                    std::env::var_os("ROUTE_TRACE")
                        .filter(|v| !v.is_empty())
                        .map(|v| (std::path::PathBuf::from(v), true))
                })
                .map(|(path, from_env)| runtime::open::RouteStreamFile { path, from_env });
            run.io_trace = args.io_trace;
            run.compute_trace = args
                .compute_trace
                .map(|p| (p, false))
                .or(args.compute_trace_layers.map(|p| (p, true)))
                .map(|(path, by_layer)| runtime::open::ComputeTraceFile { path, by_layer });
            run.predict_log = args.predict_log;
            run.route_ahead = args.route_ahead;
            run.n_expert_used = args.n_expert_used;
            run.cache_aware = args.cache_aware.config();
            run.spec = args.spec.config()?;
            if let (Some(sp), Some(_)) = (run.spec, &args.ppl) {
                anyhow::bail!(
                    "--{} speeds up decoding; --ppl decodes nothing",
                    sp.source().name()
                );
            }
            run::run(&run::Options {
                run,
                prompt: args.prompt,
                messages: args.messages,
                session: args.session,
                decide: args.decide,
                prefix_cache: args.decide_prefix_cache,
                ppl: args.ppl,
                ppl_step: args.ppl_step,
                ppl_predictions: args.ppl_predictions,
                test_hold: args.test_hold,
                n_predict: args.n_predict,
                system: args.system,
                no_think: args.no_think,
                progress: args.progress,
                csv: args.csv,
            })
        }),
        Command::Serve(args) => base_run_config(
            args.model.clone(),
            &args.history,
            &args.stream,
            &args.engine,
            args.ctx,
            &args.sampling,
        )
        .and_then(|mut run| {
            run.chatml = true;
            run.chat_if_present = true;
            run.token_figures = true;
            run.route_heat = true;
            run.n_expert_used = args.n_expert_used;
            run.cache_aware = args.cache_aware.config();
            run.spec = args.spec.config()?;
            serve::run(serve::Options {
                run,
                host: args.host,
                port: args.port,
                api_key: args
                    .api_key
                    .or_else(|| std::env::var("SLUICE_API_KEY").ok())
                    .filter(|k| !k.is_empty()),
                queue: usize::try_from(args.queue).unwrap_or(8),
                max_body: args.max_body_kb.saturating_mul(1024),
                max_connections: args.max_connections,
                alias: args.alias,
                n_predict: args.n_predict,
                system: args.system,
                no_think: args.no_think,
            })
        }),
        Command::Logits(args) => logits::run(&logits::Options {
            model: args.model,
            prompt: args.prompt,
            tokens: args.tokens,
            out: args.out,
            kv_type: args.engine.kv_type.engine(),
            threads: args.engine.threads,
            ctx: args.ctx,
            ubatch: args.engine.ubatch,
            row_prefetch: args.engine.row_prefetch.setting(),
            multi_row: args.engine.multi_row.setting(),
            dump: args.dump,
            dump_names: args.dump_names,
            stream: args.stream.config(),
            last: args.last,
            n_expert_used: args.n_expert_used,
        }),
        Command::Analyze(args) => analyze::run(args),
        Command::GenModel(args) => genmodel::run(args),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("sluice: error: {}", refusal::error_text(&err));
            ExitCode::from(2)
        }
    }
}

/// The runtime's notices, each a line on standard error.
pub fn stderr_notices() -> runtime::Notices {
    let tty = progress::stderr_is_tty();
    // A progress notice is redrawn in place on a terminal (the next notice takes its line).
    let drawn = std::sync::atomic::AtomicBool::new(false);
    runtime::Notices::new(move |n| {
        use std::sync::atomic::Ordering;
        if tty && n.level == runtime::Level::Progress {
            let bar = n.fraction.map_or(String::new(), progress::bar);
            eprint!("\r\x1b[2K{}{bar}", n.text);
            drawn.store(true, Ordering::Relaxed);
            return;
        }
        if drawn.swap(false, Ordering::Relaxed) {
            eprint!("\r\x1b[2K");
        }
        eprintln!("{}", n.text);
    })
}

/// Output piped into `head` is not an error.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
