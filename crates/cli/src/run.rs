//! `sluice run`: generate text from a prompt, streaming it to standard output, then the
//! end-of-run summary (`=== answer ===`, `=== perf ===`, `generation:`, `mode:`).
//!
//! Standard output carries only the answer and the summary; diagnostics (the seed, the prompt
//! size and prefill time, the reasoning of a reasoning model) go to standard error.

use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::{Result, bail};
use chat::ChatFormat;
use runtime::events::{Outcome, TokenRow};
use runtime::generate::{Runtime, Turn};
use runtime::open::{Loaded, RunConfig};
use runtime::prompt::chat_ids;
use runtime::sink::{Both, Sink};
use runtime::telemetry::CsvSink;
use text::Tokenizer;

use crate::lines;

/// A `sluice run`: how the model is opened and run, and what the binary does with it.
pub struct Options {
    pub run: RunConfig,
    /// The prompt of a one-shot run.
    pub prompt: Option<String>,
    /// With --chatml: a whole conversation (JSON messages) instead of one user prompt.
    pub messages: Option<PathBuf>,
    /// Serve requests from standard input (`--session`).
    pub session: bool,
    /// Answer `decide` requests in a session.
    pub decide: bool,
    /// `--decide-prefix-cache`.
    pub prefix_cache: runtime::decide::PrefixCacheMode,
    /// Score this text's perplexity instead of generating.
    pub ppl: Option<PathBuf>,
    /// With --ppl: one token per decode.
    pub ppl_step: bool,
    /// `--ppl-predictions`: where each position's most likely next token goes.
    pub ppl_predictions: Option<PathBuf>,
    /// A session's test hook: wait for a cancel at this point.
    pub test_hold: Option<runtime::cancel::Hold>,
    pub n_predict: i64,
    pub system: Option<String>,
    pub no_think: bool,
    /// `BMOE_LOAD` / `BMOE_PROGRESS` lines per token and the banner block at the end.
    pub progress: bool,
    /// The `bmoe_metrics v2` CSV sink.
    pub csv: Option<PathBuf>,
}

/// Generated text inline: the answer to standard output as it arrives, reasoning (of a chat
/// with a reasoning model) to standard error between two marker lines.
#[derive(Default)]
pub struct TextOut {
    in_reasoning: bool,
    /// The last byte written to standard output was not a newline.
    pub open_line: bool,
}

impl TextOut {
    fn end_reasoning(&mut self) {
        if self.in_reasoning {
            eprintln!("\n--- end of reasoning ---");
            self.in_reasoning = false;
        }
    }
}

impl Sink for TextOut {
    fn delta(&mut self, d: &chat::SplitDelta) -> runtime::Result<()> {
        if d.reset {
            // Text already shown as answer turned out to be reasoning: the reasoning so far is
            // shown again whole; the answer block at the end has the right split.
            self.end_reasoning();
            eprintln!("--- the answer streamed so far was reasoning ---");
        }
        if !d.reasoning.is_empty() {
            if !self.in_reasoning {
                eprintln!("--- reasoning ---");
                self.in_reasoning = true;
            }
            eprint!("{}", d.reasoning);
        }
        if !d.text.is_empty() {
            self.end_reasoning();
            let mut out = io::stdout().lock();
            out.write_all(d.text.as_bytes())?;
            out.flush()?;
            self.open_line = !d.text.ends_with('\n');
        }
        Ok(())
    }

    fn finished(&mut self, _o: &Outcome) -> runtime::Result<()> {
        self.end_reasoning();
        Ok(())
    }
}

/// Generated text as `BMOE_LOAD` / `BMOE_PROGRESS` lines on standard output: each token's
/// line carries the text delivered since the last one (`--progress`, and every session).
#[derive(Default)]
pub struct ProgressOut {
    answer: String,
    reasoning: String,
    /// The deltas since the last line: (reset, reasoning, text).
    pending: (bool, String, String),
}

impl Sink for ProgressOut {
    fn delta(&mut self, d: &chat::SplitDelta) -> runtime::Result<()> {
        if d.reset {
            // The deltas become full snapshots replacing what was delivered.
            self.answer.clear();
            self.reasoning.clear();
            self.pending = (true, String::new(), String::new());
        }
        self.reasoning.push_str(&d.reasoning);
        self.answer.push_str(&d.text);
        if self.pending.0 {
            self.pending.1 = self.reasoning.clone();
            self.pending.2 = self.answer.clone();
        } else {
            self.pending.1.push_str(&d.reasoning);
            self.pending.2.push_str(&d.text);
        }
        Ok(())
    }

    /// A token's `BMOE_LOAD` (when it read experts) and `BMOE_PROGRESS` lines, with the text
    /// delivered since the last one.
    fn token(&mut self, row: &TokenRow) -> runtime::Result<()> {
        let (reset, reasoning, text) = std::mem::take(&mut self.pending);
        let mut so = io::stdout().lock();
        if let Some(l) = lines::load_line(row) {
            writeln!(so, "{l}")?;
        }
        writeln!(
            so,
            "{}",
            lines::progress_line(row, reset, &reasoning, &text)
        )?;
        so.flush()?;
        Ok(())
    }
}

/// Prompt token ids of a one-shot run: the prompt as is (BOS as the model's metadata says,
/// special-token text not parsed), or with --chatml one user turn (or the `--messages`
/// conversation) rendered with the model's template; with the rendered prompt.
fn prompt_ids(
    opts: &Options,
    format: Option<&ChatFormat>,
    tokenizer: &Tokenizer,
) -> Result<(Vec<u32>, Option<chat::Prompt>)> {
    let text = opts.prompt.as_deref().unwrap_or_default();
    let Some(format) = format else {
        return Ok((tokenizer.encode(text, true, false), None));
    };
    let messages = match &opts.messages {
        Some(path) => runtime::prompt::read_json(path)?,
        None => runtime::prompt::single_turn(opts.system.as_deref(), text),
    };
    let prompt = runtime::prompt::render_prompt(format, &messages, None, !opts.no_think)?;
    Ok((chat_ids(format, tokenizer, &prompt.text), Some(prompt)))
}

pub fn run(opts: &Options) -> Result<()> {
    if opts.session && opts.run.route_replay.is_some() {
        bail!(
            "--route-replay replays the decode of one generation and cannot be used with --session"
        );
    }
    let notices = crate::stderr_notices();
    let loaded = Loaded::open(&opts.run, &notices)?;
    let n_ctx = loaded.n_ctx;
    // A one-shot prompt is checked before anything else is set up.
    let one_shot = if opts.session || opts.ppl.is_some() {
        None
    } else {
        let (ids, prompt) = prompt_ids(opts, loaded.format.as_ref(), &loaded.tokenizer)?;
        if ids.is_empty() {
            bail!("the prompt is empty (no tokens)");
        }
        if ids.len() > n_ctx {
            bail!(
                "the prompt is {} tokens, longer than the context of {n_ctx} tokens (-c)",
                ids.len()
            );
        }
        Some((ids, prompt))
    };
    let (mut rt, preamble) = loaded.runtime(&opts.run)?;
    let mut csv = match &opts.csv {
        Some(path) => Some(CsvSink::create(path, &preamble)?),
        None => None,
    };
    if opts.session {
        crate::session::serve(&mut rt, opts, &mut csv)?;
    } else if let Some(path) = &opts.ppl {
        crate::ppl::run(
            &mut rt,
            path,
            opts.ppl_step,
            opts.ppl_predictions.as_deref(),
        )?;
    } else if let Some((ids, prompt)) = one_shot {
        generate_once(&mut rt, opts, &ids, prompt.as_ref(), &mut csv)?;
    }
    Ok(rt.finish()?)
}

/// A one-shot run: one generation, then the summary lines.
fn generate_once(
    rt: &mut Runtime<'_>,
    opts: &Options,
    ids: &[u32],
    prompt: Option<&chat::Prompt>,
    csv: &mut Option<CsvSink>,
) -> Result<()> {
    let turn = Turn {
        ids,
        n_max: usize::try_from(opts.n_predict).unwrap_or(usize::MAX),
        prompt,
        turn: 0,
    };
    let (o, open_line) = if opts.progress {
        let o = rt.generate(&turn, &mut Both(ProgressOut::default(), csv))?;
        (o, false)
    } else {
        let mut text = TextOut::default();
        let o = rt.generate(&turn, &mut Both(&mut text, csv))?;
        (o, text.open_line)
    };
    let n_gen = o.summary.tokens;
    let mut w = io::stdout().lock();
    if open_line {
        writeln!(w)?;
    }
    if opts.progress {
        writeln!(w, "=== answer ===")?;
        writeln!(w, "{}", o.answer)?;
        writeln!(w, "=== perf ===")?;
    }
    writeln!(w, "{}", lines::generation_line(n_gen, o.decode))?;
    writeln!(
        w,
        "{}",
        lines::compute_line(&o.decode_usage, o.decode.as_secs_f64(), n_gen, rt.n_threads)
    )?;
    writeln!(w, "{}", rt.mode)?;
    if rt.streaming {
        for line in lines::stream_summary(&o.d, n_gen, o.decode, rt.overlap, rt.cache_bytes > 0) {
            writeln!(w, "{line}")?;
        }
        if let Some(line) = lines::prefetch_line(&o.d, &o.summary.prefill, rt.prefetch_tag) {
            writeln!(w, "{line}")?;
        }
        if let Some(line) = lines::prompt_ahead_line(&o.d, &o.summary.prefill) {
            writeln!(w, "{line}")?;
        }
    }
    let s = &o.summary;
    for line in lines::cache_aware_lines(&rt.engine.cache_aware(), &s.cache_aware, s.experts_routed)
    {
        writeln!(w, "{line}")?;
    }
    if let Some(sp) = &s.spec {
        for line in lines::spec_lines(sp, n_gen, o.decode.as_secs_f64()) {
            writeln!(w, "{line}")?;
        }
    }
    if rt.route_ahead > 0 {
        writeln!(w, "{}", lines::route_ahead_line(&s.ahead, rt.route_ahead))?;
    }
    if opts.run.predict_log {
        for line in lines::predict_lines(&s.ahead) {
            writeln!(w, "{line}")?;
        }
    }
    w.flush()?;
    rt.save_history();
    Ok(())
}
