//! `sluice run --session`: the model stays loaded (and the expert cache warm) while requests
//! arrive as JSON lines on standard input; responses are `BMOE_*` lines on standard output
//! (BigMoeOnEdge's session protocol, docs/session.md). Diagnostics go to standard error.
//!
//! A reader thread parses the requests and applies `cancel` at once (the generation checks
//! between prefill chunks and between tokens); every other request is handled in order by the
//! main thread. A rejected request answers `BMOE_ERROR` with `fatal:false` and changes
//! nothing; an engine failure answers `fatal:true` and ends the process.

use std::io::{self, BufRead, Write};
use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};

use anyhow::{Result, anyhow};
use serde_json::Value;
use serve::api::kind;

use runtime::cancel::Control;
use runtime::generate::Runtime;
use runtime::session::{ChatRequest, DecideRequest, Session, SessionConfig};
use runtime::sink::Both;
use runtime::telemetry::CsvSink;
use telemetry::bmoe_session::{self, Line};

use crate::run::{Options, ProgressOut};

/// Longest request line read; a longer one is refused (and skipped to its end).
pub const MAX_LINE: usize = 16 << 20;

/// A `generate` request: its id and the chat turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Generate {
    pub id: i64,
    pub req: ChatRequest,
}

/// A `decide` request: its id and the decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Decide {
    pub id: i64,
    pub req: DecideRequest,
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
                req: ChatRequest {
                    prompt: string("prompt", true)?.unwrap_or_default(),
                    n_predict,
                    think: boolean("think")?,
                    clear_kv: boolean("clear_kv")?.unwrap_or(true),
                },
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
                req: DecideRequest {
                    prefix: string("prefix", false)?.unwrap_or_default(),
                    suffix: string("suffix", false)?.unwrap_or_default(),
                    choices,
                    reuse_prefix: boolean("reuse_prefix")?.unwrap_or(true),
                },
            }))
        }
        "cancel" => Ok(Request::Cancel),
        _ => Ok(Request::Close),
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
    Line::Error(bmoe_session::Error {
        id,
        fatal,
        msg: msg.to_owned(),
    })
    .to_string()
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
        if e.is_rejected() {
            Failure::Refused(crate::refusal::runtime_error(&e))
        } else {
            Failure::Fatal(e.into())
        }
    }
}

/// A `generate` request: accepted, `BMOE_BEGIN`, the turn's `BMOE_PROGRESS` lines (and CSV
/// rows), `BMOE_DONE`.
fn generate(
    rt: &mut Runtime<'_>,
    s: &mut Session,
    csv: &mut Option<CsvSink>,
    g: &Generate,
) -> Result<(), Failure> {
    let accepted = s.accept_chat(rt, &g.req)?;
    emit(&Line::Begin { id: g.id }.to_string())?;
    let o = s.chat(rt, accepted, &mut Both(ProgressOut::default(), csv))?;
    emit(&crate::lines::done_line(
        &o.summary,
        g.id,
        o.cancelled,
        rt.engine.n_past(),
        &o.reasoning,
        &o.answer,
    ))?;
    Ok(())
}

/// A `decide` request: accepted, `BMOE_BEGIN`, `BMOE_DECIDE`.
fn decide(rt: &mut Runtime<'_>, s: &mut Session, d: &Decide) -> Result<(), Failure> {
    let accepted = s.accept_decide(rt, &d.req)?;
    emit(&Line::Begin { id: d.id }.to_string())?;
    let decision = s.decide(rt, accepted)?;
    emit(&decision.line(d.id))?;
    Ok(())
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
    let ready = Line::Ready(bmoe_session::Ready {
        load_s: rt.load_s,
        arch: rt.arch.clone(),
        n_ctx: rt.n_ctx as u64,
        // Without a template nothing asks the model to reason.
        think_ctl: rt
            .format
            .map_or("template", |f| f.think_ctl().as_str())
            .to_owned(),
        n_expert_used: u64::from(hp.n_expert_used.max()),
    });
    emit(&ready.to_string())?;

    let mut s = Session::new(SessionConfig {
        system: opts.system.clone(),
        think: !opts.no_think,
        n_predict: opts.n_predict,
        decide: opts.decide,
        prefix_cache: opts.prefix_cache,
    });
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
            Request::Generate(g) => (g.id, generate(rt, &mut s, csv, g)),
            Request::Decide(d) => (d.id, decide(rt, &mut s, d)),
            Request::Cancel | Request::Close => (0, Ok(())),
        };
        ctl.done();
        match done {
            Ok(()) => {}
            Err(Failure::Refused(msg)) => emit(&error_line(id, false, &msg))?,
            Err(Failure::Fatal(e)) => {
                emit(&error_line(id, true, &crate::refusal::error_text(&e)))?;
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
                req: ChatRequest {
                    prompt: "hi".into(),
                    n_predict: None,
                    think: None,
                    clear_kv: true,
                },
            })
        );
        assert_eq!(
            parse_request(br#"{"cmd":"decide","id":1,"prefix":"a","choices":["A","B"]}"#).unwrap(),
            Request::Decide(Decide {
                id: 1,
                req: DecideRequest {
                    prefix: "a".into(),
                    suffix: String::new(),
                    choices: vec!["A".into(), "B".into()],
                    reuse_prefix: true,
                },
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
