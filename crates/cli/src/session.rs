//! `sluice run --session`: the model stays loaded (and the expert cache warm) while requests
//! arrive as JSON lines on standard input; responses are `BMOE_*` lines on standard output
//! (spec/bmoe-telemetry.md, "Session mode"). Diagnostics go to standard error.
//!
//! A reader thread parses the requests and applies `cancel` at once (the generation checks
//! between prefill chunks and between tokens); every other request is handled in order by the
//! main thread. A rejected request answers `BMOE_ERROR` with `fatal:false` and changes
//! nothing; an engine failure answers `fatal:true` and ends the process.

use std::io::{self, BufRead, Write};
use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};
use std::time::Instant;

use anyhow::{Result, anyhow};
use chat::Data;
use serde_json::Value;

use runtime::cancel::Control;
use runtime::decide::{self, Kept, Plan};
use runtime::generate::{Runtime, Turn};
use runtime::prompt::chat_ids;
use runtime::sink::Both;
use runtime::telemetry::{CsvSink, JsonObject, json_exact};

use crate::run::{Options, ProgressOut};

/// Longest request line read; a longer one is refused (and skipped to its end).
pub const MAX_LINE: usize = 16 << 20;

/// A `generate` request.
#[derive(Debug, Clone, PartialEq)]
pub struct Generate {
    pub id: i64,
    pub prompt: String,
    pub n_predict: Option<i64>,
    pub think: Option<bool>,
    pub clear_kv: bool,
}

/// A `decide` request.
#[derive(Debug, Clone, PartialEq)]
pub struct Decide {
    pub id: i64,
    pub prefix: String,
    pub suffix: String,
    pub choices: Vec<String>,
    pub reuse_prefix: bool,
}

/// One request line.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Generate(Generate),
    Decide(Decide),
    Cancel,
    Close,
}

/// A refused request line: the id it carried (-1 when none could be read) and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub id: i64,
    pub msg: String,
}

/// Parses one request line (without its newline).
pub fn parse_request(line: &[u8]) -> Result<Request, Refusal> {
    let refuse = |id: i64, msg: String| Refusal { id, msg };
    let text = std::str::from_utf8(line)
        .map_err(|e| refuse(-1, format!("the request is not UTF-8 text: {e}")))?;
    let v: Value = serde_json::from_str(text)
        .map_err(|e| refuse(-1, format!("the request is not valid JSON: {e}")))?;
    let Value::Object(obj) = v else {
        return Err(refuse(-1, "the request is not a JSON object".into()));
    };
    let id = match obj.get("id") {
        None => None,
        Some(v) => match v.as_i64() {
            Some(i) if i >= 0 => Some(i),
            _ => {
                return Err(refuse(
                    -1,
                    format!("\"id\" must be a non-negative integer, got {v}"),
                ));
            }
        },
    };
    let refuse = |msg: String| Refusal {
        id: id.unwrap_or(-1),
        msg,
    };
    let cmd = match obj.get("cmd") {
        Some(Value::String(c)) => c.as_str(),
        Some(v) => return Err(refuse(format!("\"cmd\" must be a string, got {v}"))),
        None => return Err(refuse("the request has no \"cmd\"".into())),
    };
    let allowed: &[&str] = match cmd {
        "generate" => &["cmd", "id", "prompt", "n_predict", "think", "clear_kv"],
        "decide" => &["cmd", "id", "prefix", "suffix", "choices", "reuse_prefix"],
        "cancel" | "close" => &["cmd", "id"],
        other => {
            return Err(refuse(format!(
                "unknown command {other:?} (generate, decide, cancel, close)"
            )));
        }
    };
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(refuse(format!("unknown key {k:?} in a {cmd:?} request")));
    }
    // The answers name the request they answer.
    let id = match (cmd, id) {
        ("generate" | "decide", None) => {
            return Err(refuse(format!("a {cmd:?} request needs an \"id\"")));
        }
        (_, id) => id.unwrap_or(-1),
    };
    let string = |key: &str, required: bool| -> Result<Option<String>, Refusal> {
        match obj.get(key) {
            None if required => Err(refuse(format!("a {cmd:?} request needs \"{key}\""))),
            None => Ok(None),
            Some(Value::String(s)) if s.contains('\0') => {
                Err(refuse(format!("\"{key}\" contains a NUL character")))
            }
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(refuse(format!(
                "\"{key}\" must be a string, got {}",
                kind(v)
            ))),
        }
    };
    let boolean = |key: &str| -> Result<Option<bool>, Refusal> {
        match obj.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(refuse(format!(
                "\"{key}\" must be true or false, got {}",
                kind(v)
            ))),
        }
    };
    match cmd {
        "generate" => {
            let n_predict = match obj.get("n_predict") {
                None => None,
                Some(v) => match v.as_i64() {
                    Some(n) if n >= -1 => Some(n),
                    _ => {
                        return Err(refuse(format!(
                            "\"n_predict\" must be an integer, -1 (no limit) or more, got {v}"
                        )));
                    }
                },
            };
            Ok(Request::Generate(Generate {
                id,
                prompt: string("prompt", true)?.unwrap_or_default(),
                n_predict,
                think: boolean("think")?,
                clear_kv: boolean("clear_kv")?.unwrap_or(true),
            }))
        }
        "decide" => {
            let choices = match obj.get("choices") {
                Some(Value::Array(items)) => items
                    .iter()
                    .enumerate()
                    .map(|(i, c)| match c {
                        Value::String(s) if s.contains('\0') => {
                            Err(refuse(format!("choice {i} contains a NUL character")))
                        }
                        Value::String(s) => Ok(s.clone()),
                        v => Err(refuse(format!(
                            "choice {i} must be a string, got {}",
                            kind(v)
                        ))),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                Some(v) => {
                    return Err(refuse(format!(
                        "\"choices\" must be an array of strings, got {}",
                        kind(v)
                    )));
                }
                None => return Err(refuse("a \"decide\" request needs \"choices\"".into())),
            };
            Ok(Request::Decide(Decide {
                id,
                prefix: string("prefix", false)?.unwrap_or_default(),
                suffix: string("suffix", false)?.unwrap_or_default(),
                choices,
                reuse_prefix: boolean("reuse_prefix")?.unwrap_or(true),
            }))
        }
        "cancel" => Ok(Request::Cancel),
        _ => Ok(Request::Close),
    }
}

/// A JSON value's kind, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What the reader thread hands the main thread, in input order.
enum Msg {
    /// A request to carry out, numbered.
    Work(u64, Request),
    /// A refused line.
    Bad(Refusal),
    /// Standard input failed.
    Failed(String),
    /// `close`, or the end of the input.
    Close,
}

/// One line of at most `max` bytes (without the newline); `Err(n)` for a longer line, which is
/// skipped to its end (`n` bytes). `None` at the end of the input.
fn read_line(r: &mut impl BufRead, max: usize) -> io::Result<Option<Result<Vec<u8>, usize>>> {
    let mut line = Vec::new();
    let mut len = 0usize;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok((len > 0).then_some(if len > max { Err(len) } else { Ok(line) }));
        }
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        len += chunk.len();
        if len <= max {
            line.extend_from_slice(chunk);
        } else {
            line = Vec::new();
        }
        let used = done.unwrap_or(chunk.len());
        r.consume(used);
        if done.is_some() {
            return Ok(Some(if len > max { Err(len) } else { Ok(line) }));
        }
    }
}

fn reader(ctl: Arc<Control>, tx: Sender<Msg>) {
    let mut input = io::stdin().lock();
    let mut seq = 0u64;
    loop {
        let line = match read_line(&mut input, MAX_LINE) {
            Ok(Some(Ok(l))) => l,
            Ok(Some(Err(n))) => {
                let msg = format!("a request line of {n} bytes, longer than {MAX_LINE}");
                if tx.send(Msg::Bad(Refusal { id: -1, msg })).is_err() {
                    return;
                }
                continue;
            }
            Ok(None) => {
                ctl.close();
                let _ = tx.send(Msg::Close);
                return;
            }
            Err(e) => {
                ctl.close();
                let _ = tx.send(Msg::Failed(format!("cannot read standard input: {e}")));
                return;
            }
        };
        // Blank lines (and a CR of CRLF input) carry no request.
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let msg = match parse_request(line) {
            Ok(Request::Cancel) => {
                ctl.cancel(seq);
                continue;
            }
            Ok(Request::Close) => {
                ctl.close();
                let _ = tx.send(Msg::Close);
                return;
            }
            Ok(work) => {
                seq += 1;
                Msg::Work(seq, work)
            }
            Err(r) => Msg::Bad(r),
        };
        if tx.send(msg).is_err() {
            return;
        }
    }
}

/// Writes one protocol line to standard output, flushed.
fn emit(line: &str) -> Result<()> {
    let mut o = io::stdout().lock();
    writeln!(o, "{line}")?;
    o.flush()?;
    Ok(())
}

fn error_line(id: i64, fatal: bool, msg: &str) -> String {
    let mut o = JsonObject::default();
    o.int("id", id).bool("fatal", fatal).str("msg", msg);
    format!("BMOE_ERROR {}", o.finish())
}

/// A request's failure: refused (the session goes on) or fatal.
enum Failure {
    Refused(String),
    Fatal(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Failure {
        Failure::Fatal(e)
    }
}

impl From<runtime::Error> for Failure {
    fn from(e: runtime::Error) -> Failure {
        Failure::Fatal(e.into())
    }
}

impl From<engine::ForwardError> for Failure {
    fn from(e: engine::ForwardError) -> Failure {
        Failure::Fatal(e.into())
    }
}

/// The conversation and the context's bookkeeping.
struct Session<'o> {
    opts: &'o Options,
    /// The `--csv` file, which every turn adds to.
    csv: &'o mut Option<CsvSink>,
    /// The chat so far: (role, content).
    conv: Vec<(&'static str, String)>,
    /// The tokens in the engine's context, in order.
    kv_tokens: Vec<u32>,
    /// The state kept after the last decision's prefix.
    kept: Option<Kept>,
    turn: u32,
}

impl Session<'_> {
    /// The conversation as the model sees it: rendered with the chat template (opening the
    /// assistant's turn), or without one the texts one after the other.
    fn render(
        &self,
        rt: &Runtime<'_>,
        conv: &[(&str, String)],
        think: bool,
    ) -> Result<(Vec<u32>, Option<chat::Prompt>)> {
        match rt.format {
            Some(format) => {
                let mut messages = Vec::new();
                let message = |role: &str, content: &str| {
                    Data::object([
                        ("role", Data::string(role)),
                        ("content", Data::string(content)),
                    ])
                };
                if let Some(s) = &self.opts.system {
                    messages.push(message("system", s));
                }
                for (role, content) in conv {
                    messages.push(message(role, content));
                }
                let prompt =
                    runtime::prompt::render_prompt(format, &Data::array(messages), None, think)?;
                Ok((chat_ids(format, rt.tokenizer, &prompt.text), Some(prompt)))
            }
            None => {
                let text: String = conv.iter().map(|(_, c)| c.as_str()).collect();
                Ok((rt.tokenizer.encode(&text, true, false), None))
            }
        }
    }

    fn generate(&mut self, rt: &mut Runtime<'_>, g: &Generate) -> Result<(), Failure> {
        let think = g.think.unwrap_or(!self.opts.no_think);
        let mut conv = if g.clear_kv {
            Vec::new()
        } else {
            self.conv.clone()
        };
        conv.push(("user", g.prompt.clone()));
        let (ids, prompt) = self
            .render(rt, &conv, think)
            .map_err(|e| Failure::Refused(format!("{e:#}")))?;
        let n_ctx = rt.n_ctx;
        let n_predict = g.n_predict.unwrap_or(self.opts.n_predict);
        if ids.len() >= n_ctx {
            return Err(Failure::Refused(format!(
                "the prompt is {} tokens and the context holds {n_ctx} (-c): no room to generate",
                ids.len()
            )));
        }
        if n_predict >= 0 && ids.len() as u128 + n_predict as u128 > n_ctx as u128 {
            return Err(Failure::Refused(format!(
                "the prompt ({} tokens) plus n_predict ({n_predict}) exceeds the context of \
                 {n_ctx} tokens (-c)",
                ids.len()
            )));
        }
        // Accepted: a new chat drops the conversation and the context (the expert cache stays
        // warm; a cancelled new chat leaves an empty one), and a generation drops the
        // decisions' kept state.
        if g.clear_kv {
            rt.engine.reset();
            self.kv_tokens.clear();
            self.conv.clear();
        }
        self.kept = None;
        emit(&format!("BMOE_BEGIN {{\"id\":{}}}", g.id))?;
        // The context keeps the tokens the new rendering starts with; at least one is run.
        let mut reuse = decide::common_prefix(&self.kv_tokens, &ids);
        if reuse == ids.len() {
            reuse -= 1;
        }
        rt.engine.truncate(reuse);
        self.kv_tokens.truncate(reuse);
        let o = rt.generate(
            &Turn {
                ids: &ids,
                n_max: usize::try_from(n_predict).unwrap_or(usize::MAX),
                prompt: prompt.as_ref(),
                turn: self.turn,
            },
            &mut Both(ProgressOut::default(), &mut *self.csv),
        )?;
        self.turn += 1;
        if o.cancelled {
            // Rolled back: the conversation without this turn, the context as it was reused.
            rt.engine.truncate(reuse);
        } else {
            self.kv_tokens = ids;
            self.kv_tokens.extend_from_slice(&o.tokens);
            conv.push(("assistant", o.answer.clone()));
            self.conv = conv;
        }
        self.kv_tokens.truncate(rt.engine.n_past());
        emit(&o.summary.done_line(
            g.id,
            o.cancelled,
            rt.engine.n_past(),
            &o.reasoning,
            &o.answer,
        ))?;
        rt.save_history();
        Ok(())
    }

    fn decide(&mut self, rt: &mut Runtime<'_>, d: &Decide) -> Result<(), Failure> {
        if !self.opts.decide {
            return Err(Failure::Refused(
                "decide requests need a session started with --decide".into(),
            ));
        }
        let firsts = decide::first_tokens(rt.tokenizer, &d.choices).map_err(Failure::Refused)?;
        let whole = format!("{}{}", d.prefix, d.suffix);
        // Always rendered with reasoning off: the answer's first token is read.
        let refuse = |e: anyhow::Error| Failure::Refused(format!("{e:#}"));
        let (full, _) = self.render(rt, &[("user", whole)], false).map_err(refuse)?;
        let (alone, _) = self
            .render(rt, &[("user", d.prefix.clone())], false)
            .map_err(refuse)?;
        let n_ctx = rt.n_ctx;
        if full.len() > n_ctx {
            return Err(Failure::Refused(format!(
                "the decision's prompt is {} tokens, longer than the context of {n_ctx} (-c)",
                full.len()
            )));
        }
        emit(&format!("BMOE_BEGIN {{\"id\":{}}}", d.id))?;
        // The conversation's context is put back afterwards: a decision leaves no trace in it.
        let saved = (rt.engine.n_past() > 0).then(|| rt.engine.save_state());
        let split = decide::split_at(&full, &alone);
        let plan = decide::plan(
            self.opts.prefix_cache.keeps(),
            d.reuse_prefix,
            self.kept.as_ref().map(|k| k.tokens.as_slice()),
            &full,
            split,
        );
        let usage0 = runtime::telemetry::Usage::now();
        let snap0 = rt.counters.snapshot();
        let mut restore_s = 0.0;
        let mut store_s = 0.0;
        let mut prefill_s = 0.0;
        let mut n_reused = 0;
        let ran = (|| -> Result<Vec<f32>, engine::ForwardError> {
            rt.engine.reset();
            let mut from = 0;
            let mut keep_at = None;
            match plan {
                Plan::Whole => {}
                Plan::Fresh { split } => keep_at = Some(split),
                Plan::Restore { from: kept, split } => {
                    let t = Instant::now();
                    if let Some(k) = &self.kept {
                        rt.engine.restore_state(&k.state)?;
                    }
                    restore_s = t.elapsed().as_secs_f64();
                    from = kept;
                    n_reused = kept;
                    if split > kept {
                        keep_at = Some(split);
                    }
                }
            }
            if let Some(split) = keep_at {
                let t = Instant::now();
                rt.prefill(&full[from..split], self.turn)?;
                prefill_s += t.elapsed().as_secs_f64();
                let t = Instant::now();
                self.kept = Some(Kept {
                    tokens: full[..split].to_vec(),
                    state: rt.engine.save_state(),
                });
                store_s = t.elapsed().as_secs_f64();
                from = split;
            }
            let t = Instant::now();
            let logits = rt.prefill(&full[from..], self.turn)?;
            prefill_s += t.elapsed().as_secs_f64();
            Ok(logits)
        })();
        let usage = runtime::telemetry::Usage::now().since(&usage0);
        let p = rt.counters.snapshot().since(&snap0);
        // Back to the conversation.
        match &saved {
            Some(s) => rt.engine.restore_state(s)?,
            None => rt.engine.reset(),
        }
        let (cancelled, logp) = match ran {
            Ok(logits) => (false, decide::log_softmax_at(&logits, &firsts)),
            Err(engine::ForwardError::Cancelled) => (true, Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let secs = |ns: u64| ns as f64 / 1e9;
        let logp_json: Vec<String> = logp.iter().map(|&v| json_exact(v)).collect();
        let mut o = JsonObject::default();
        o.int("id", d.id)
            .bool("cancelled", cancelled)
            .int(
                "best",
                if cancelled {
                    -1
                } else {
                    decide::best(&logp) as i64
                },
            )
            .raw("choice_logp", &format!("[{}]", logp_json.join(",")))
            .int("n_tokens", full.len() as i64)
            .int("n_reused", n_reused as i64)
            .int("n_prefilled", (full.len() - n_reused) as i64)
            .float("restore_s", restore_s, 6)
            .float("store_s", store_s, 6)
            .float("prefill_s", prefill_s, 6)
            .float("prefill_cpu_s", secs(usage.cpu_ns), 3)
            .float("prefill_read_mib", mib(p.read_bytes), 3)
            .float("prefill_io_s", secs(p.io_ns), 3)
            .float("prefill_stall_s", secs(p.stall_ns), 3)
            .float("prefill_mgmt_s", secs(p.mgmt_ns), 3)
            .int("prefill_dev_tokens", 0)
            .float("prefill_dev_read_mib", 0.0, 1)
            .float("prefill_dev_stall_s", 0.0, 1)
            .int("prefill_dev_routed", 0)
            .int("prefill_dev_demand", 0)
            .float(
                "prefix_state_mib",
                self.kept
                    .as_ref()
                    .map_or(0.0, |k| mib(k.state.bytes() as u64)),
                3,
            );
        emit(&format!("BMOE_DECIDE {}", o.finish()))?;
        Ok(())
    }
}

/// Serves requests until `close` or the end of the input.
pub fn serve(rt: &mut Runtime<'_>, opts: &Options, csv: &mut Option<CsvSink>) -> Result<()> {
    let ctl = Arc::new(Control::new(opts.test_hold, rt.notices.clone()));
    rt.install_control(Arc::clone(&ctl));
    let (tx, rx) = channel();
    let reading = Arc::clone(&ctl);
    std::thread::Builder::new()
        .name("session-input".into())
        .spawn(move || reader(reading, tx))
        .map_err(|e| anyhow!("cannot start the input thread: {e}"))?;

    let hp = rt.engine.hparams();
    let mut ready = JsonObject::default();
    ready
        .float("load_s", rt.load_s, 3)
        .str("arch", &rt.arch)
        .int("n_ctx", rt.n_ctx as i64)
        .str(
            "think_ctl",
            // Without a template nothing asks the model to reason.
            rt.format.map_or("template", |f| f.think_ctl().as_str()),
        )
        .int("n_expert_used", i64::from(hp.n_expert_used.max()));
    emit(&format!("BMOE_READY {}", ready.finish()))?;

    let mut s = Session {
        opts,
        csv,
        conv: Vec::new(),
        kv_tokens: Vec::new(),
        kept: None,
        turn: 0,
    };
    for msg in rx {
        let (seq, req) = match msg {
            Msg::Work(seq, req) => (seq, req),
            Msg::Bad(r) => {
                emit(&error_line(r.id, false, &r.msg))?;
                continue;
            }
            Msg::Failed(e) => {
                emit(&error_line(-1, true, &e))?;
                return Err(anyhow!(e));
            }
            Msg::Close => break,
        };
        ctl.start(seq);
        let (id, done) = match &req {
            Request::Generate(g) => (g.id, s.generate(rt, g)),
            Request::Decide(d) => (d.id, s.decide(rt, d)),
            Request::Cancel | Request::Close => (0, Ok(())),
        };
        ctl.done();
        match done {
            Ok(()) => {}
            Err(Failure::Refused(msg)) => emit(&error_line(id, false, &msg))?,
            Err(Failure::Fatal(e)) => {
                emit(&error_line(id, true, &format!("{e:#}")))?;
                return Err(e);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(line: &str) -> Refusal {
        parse_request(line.as_bytes()).unwrap_err()
    }

    #[test]
    fn requests_parse_with_their_defaults() {
        assert_eq!(
            parse_request(br#"{"cmd":"generate","id":3,"prompt":"hi"}"#).unwrap(),
            Request::Generate(Generate {
                id: 3,
                prompt: "hi".into(),
                n_predict: None,
                think: None,
                clear_kv: true,
            })
        );
        assert_eq!(
            parse_request(br#"{"cmd":"decide","id":1,"prefix":"a","choices":["A","B"]}"#).unwrap(),
            Request::Decide(Decide {
                id: 1,
                prefix: "a".into(),
                suffix: String::new(),
                choices: vec!["A".into(), "B".into()],
                reuse_prefix: true,
            })
        );
        assert_eq!(
            parse_request(br#"{"cmd":"cancel"}"#).unwrap(),
            Request::Cancel
        );
        assert_eq!(
            parse_request(br#"{"cmd":"close"}"#).unwrap(),
            Request::Close
        );
    }

    #[test]
    fn bad_requests_are_refused_with_their_id_when_it_can_be_read() {
        assert_eq!(refused("{").id, -1);
        assert_eq!(refused("[1]").id, -1);
        assert_eq!(
            refused(r#"{"cmd":"generate","id":"7","prompt":"x"}"#).id,
            -1
        );
        assert_eq!(refused(r#"{"cmd":"generate","id":-2,"prompt":"x"}"#).id, -1);
        let r = refused(r#"{"cmd":"fly","id":7}"#);
        assert_eq!(r.id, 7);
        assert!(r.msg.contains("unknown command"), "{}", r.msg);
        assert!(
            refused(r#"{"cmd":"generate","id":7}"#)
                .msg
                .contains("prompt")
        );
        assert!(
            refused(r#"{"cmd":"generate","id":7,"prompt":"x","n_predct":3}"#)
                .msg
                .contains("n_predct")
        );
        // A number past f64 is not JSON serde_json reads; one past i64 is not an integer.
        assert_eq!(
            refused(r#"{"cmd":"generate","id":7,"prompt":"x","n_predict":1e400}"#).id,
            -1
        );
        assert!(
            refused(r#"{"cmd":"generate","id":7,"prompt":"x","n_predict":99999999999999999999}"#)
                .msg
                .contains("n_predict")
        );
        assert!(
            refused(r#"{"cmd":"generate","id":7,"prompt":"x","n_predict":-2}"#)
                .msg
                .contains("n_predict")
        );
        assert!(
            refused(r#"{"cmd":"generate","id":7,"prompt":"a\u0000b"}"#)
                .msg
                .contains("NUL")
        );
        assert!(
            refused(r#"{"cmd":"decide","id":7,"choices":[1]}"#)
                .msg
                .contains("choice 0")
        );
        assert!(parse_request(b"{\"cmd\":\"close\"}\xff").is_err());
    }

    #[test]
    fn long_lines_are_refused_and_skipped() {
        let input = format!("{}\n{{\"cmd\":\"close\"}}\nlast", "x".repeat(100));
        let mut r = io::BufReader::with_capacity(7, input.as_bytes());
        assert_eq!(read_line(&mut r, 50).unwrap(), Some(Err(100)));
        assert_eq!(
            read_line(&mut r, 50).unwrap(),
            Some(Ok(b"{\"cmd\":\"close\"}".to_vec()))
        );
        assert_eq!(read_line(&mut r, 50).unwrap(), Some(Ok(b"last".to_vec())));
        assert_eq!(read_line(&mut r, 50).unwrap(), None);
    }
}
