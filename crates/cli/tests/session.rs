//! `sluice run --session`: BigMoeOnEdge's session protocol ("Session mode"),
//! driven through pipes like a real caller (requests written to standard input, a reader
//! thread on each output stream). Every standard output line of every session goes through a
//! parser written from the spec (the key lists and JSON types below are transcribed from it,
//! never read from our writer), so standard output must hold only `BMOE_<TAG> {json}` lines.
//!
//! What is checked: a continued chat answers turn by turn as a one-shot run over the same
//! history while prefilling less; a cancelled turn (during prefill and during decode, held
//! deterministically by the hidden `--test-hold` hook) leaves no trace; a decision scores the
//! log-softmax of `sluice logits --last` bit for bit, a restored prefix scores what a fresh
//! computation scores, and refused requests leave the session as it was; 200 malformed
//! request lines each get one non-fatal `BMOE_ERROR`; resident and streaming sessions answer
//! the same; the `--csv` file spans the turns.
//!
//! Blank request lines (empty, or only spaces, tabs and a carriage return) are not specified
//! by the protocol. The hostile-lines test accepts either policy, applied to all of them: every
//! blank line ignored, or every blank line answered by one `BMOE_ERROR` with id -1.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gguf::{GgufFile, GgufWriter, Value as GgufValue};
use serde_json::{Value, json};

mod common;
use common::spec::*;
use common::{ok, read_npy, sluice};

// ---- the spec, transcribed ----

/// `BMOE_READY` keys and their JSON types ("int", "float", "string", "bool", and
/// "[float|null]" for an array of numbers or nulls).
const READY_KEYS: &[(&str, &str)] = &[
    ("load_s", "float"),
    ("arch", "string"),
    ("n_ctx", "int"),
    ("think_ctl", "string"),
    ("n_expert_used", "int"),
];

/// The values `BMOE_READY.think_ctl` may take.
const THINK_CTL: &[&str] = &["template", "prefill", "none"];

const BEGIN_KEYS: &[(&str, &str)] = &[("id", "int")];

const DONE_KEYS: &[(&str, &str)] = &[
    ("id", "int"),
    ("cancelled", "bool"),
    ("tokens", "int"),
    ("tok_s", "float"),
    ("prefill_s", "float"),
    ("prefill_tps", "float"),
    ("load_s", "float"),
    ("cache_hit_pct", "float"),
    ("n_prompt", "int"),
    ("n_past", "int"),
    ("compute_s_tok", "float"),
    ("io_s_tok", "float"),
    ("cache_resident_mib", "float"),
    ("cache_budget_mib", "float"),
    ("read_mib", "float"),
    ("stall_s_tok", "float"),
    ("mgmt_s_tok", "float"),
    ("majflt_tok", "float"),
    ("cpu_s_tok", "float"),
    ("prefill_cpu_s", "float"),
    ("prefill_read_mib", "float"),
    ("prefill_io_s", "float"),
    ("prefill_stall_s", "float"),
    ("prefill_mgmt_s", "float"),
    ("prefill_dev_tokens", "int"),
    ("prefill_dev_nodes", "int"),
    ("prefill_dev_read_mib", "float"),
    ("prefill_dev_stall_s", "float"),
    ("token_demand_mib", "float"),
    ("mtp_drafted", "int"),
    ("mtp_accepted", "int"),
    ("mtp_decodes", "int"),
    ("mtp_draft_s_tok", "float"),
    ("drafted_steps", "int"),
    ("loop_overhead_s_tok", "float"),
    ("reasoning", "string"),
    ("text", "string"),
];

const DECIDE_KEYS: &[(&str, &str)] = &[
    ("id", "int"),
    ("cancelled", "bool"),
    ("best", "int"),
    ("choice_logp", "[float|null]"),
    ("n_tokens", "int"),
    ("n_reused", "int"),
    ("n_prefilled", "int"),
    ("restore_s", "float"),
    ("store_s", "float"),
    ("prefill_s", "float"),
    ("prefill_cpu_s", "float"),
    ("prefill_read_mib", "float"),
    ("prefill_io_s", "float"),
    ("prefill_stall_s", "float"),
    ("prefill_mgmt_s", "float"),
    ("prefill_dev_tokens", "int"),
    ("prefill_dev_read_mib", "float"),
    ("prefill_dev_stall_s", "float"),
    ("prefill_dev_routed", "int"),
    ("prefill_dev_demand", "int"),
    ("prefix_state_mib", "float"),
];

const ERROR_KEYS: &[(&str, &str)] = &[("id", "int"), ("fatal", "bool"), ("msg", "string")];

/// `BMOE_DONE`'s speculation counters: all 0 without speculation (`mtp_decodes` 0: a run
/// without `--ngram` counts no decodes there).
const DONE_SPEC: &[&str] = &[
    "mtp_drafted",
    "mtp_accepted",
    "mtp_decodes",
    "mtp_draft_s_tok",
    "drafted_steps",
];

/// `BMOE_DONE` keys that are 0 in every run of this test: the prefill-device ones ("All zero
/// when the device is off").
const DONE_ZERO: &[&str] = &[
    "prefill_dev_tokens",
    "prefill_dev_nodes",
    "prefill_dev_read_mib",
    "prefill_dev_stall_s",
];

/// `BMOE_DECIDE` keys that are 0 without `--prefill-device`.
const DECIDE_ZERO: &[&str] = &[
    "prefill_dev_tokens",
    "prefill_dev_read_mib",
    "prefill_dev_stall_s",
];

/// Requests (stdin): each command's keys and types.
const GENERATE_REQUEST: &[(&str, &str)] = &[
    ("cmd", "string"),
    ("id", "int"),
    ("prompt", "string"),
    ("n_predict", "int"),
    ("think", "bool"),
    ("clear_kv", "bool"),
];

// ---- the parser of the output lines ----

fn has_type(v: &Value, ty: &str) -> bool {
    match ty {
        "int" => v.is_i64() || v.is_u64(),
        "float" => v.is_number(),
        "string" => v.is_string(),
        "bool" => v.is_boolean(),
        "[float|null]" => v
            .as_array()
            .is_some_and(|a| a.iter().all(|x| x.is_number() || x.is_null())),
        _ => panic!("unknown type {ty}"),
    }
}

/// The object of `json`, checked against `keys` (every key present with its type; no other
/// key except those in `optional`).
fn check_object(tag: &str, json: &str, keys: &[(&str, &str)], optional: &[&str]) -> Value {
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("BMOE_{tag}: {e}: {json}"));
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("BMOE_{tag}: not an object: {json}"));
    for (k, ty) in keys {
        let x = obj
            .get(*k)
            .unwrap_or_else(|| panic!("BMOE_{tag}: no {k} in {json}"));
        assert!(
            has_type(x, ty),
            "BMOE_{tag}: {k}: {x} is not a {ty}: {json}"
        );
    }
    for k in obj.keys() {
        assert!(
            keys.iter().any(|(n, _)| n == k) || optional.contains(&k.as_str()),
            "BMOE_{tag}: unknown key {k}: {json}"
        );
    }
    v
}

/// One standard output line of a session: its tag (`READY`, `BEGIN`, `LOAD`, `PROGRESS`,
/// `DONE`, `DECIDE`, `ERROR`), its checked object, and the line as printed.
#[derive(Debug, Clone)]
struct Line {
    tag: String,
    v: Value,
    raw: String,
}

fn parse_line(raw: &str) -> Line {
    let (tag, json) = raw
        .split_once(' ')
        .unwrap_or_else(|| panic!("not a `BMOE_<TAG> {{json}}` line: {raw:?}"));
    let tag = tag
        .strip_prefix("BMOE_")
        .unwrap_or_else(|| panic!("not a BMOE_ line: {raw:?}"));
    let (keys, optional): (&[(&str, &str)], &[&str]) = match tag {
        "READY" => (READY_KEYS, &[]),
        "BEGIN" => (BEGIN_KEYS, &[]),
        "LOAD" => (LOAD_KEYS, &[]),
        "PROGRESS" => (PROGRESS_KEYS, &["reset"]),
        "DONE" => (DONE_KEYS, &[]),
        "DECIDE" => (DECIDE_KEYS, &[]),
        "ERROR" => (ERROR_KEYS, &[]),
        _ => panic!("unknown tag BMOE_{tag}: {raw:?}"),
    };
    let v = check_object(tag, json, keys, optional);
    match tag {
        "READY" => {
            let t = v["think_ctl"].as_str().unwrap();
            assert!(THINK_CTL.contains(&t), "think_ctl {t}: {raw}");
        }
        "PROGRESS" => {
            if let Some(r) = v.get("reset") {
                assert_eq!(r, 1, "reset is only ever 1: {raw}");
            }
        }
        "DONE" => {
            for k in DONE_ZERO {
                assert_eq!(v[*k].as_f64(), Some(0.0), "{k}: {raw}");
            }
            let n = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            if n("mtp_decodes") == 0.0 {
                for k in DONE_SPEC {
                    assert_eq!(v[*k].as_f64(), Some(0.0), "{k}: {raw}");
                }
            } else {
                // speculating: every token had a pass or was a kept draft (but a last one that
                // ended the turn early, which is not run)
                let ran = n("mtp_decodes") + n("mtp_accepted");
                assert!(ran == n("tokens") || ran + 1.0 == n("tokens"), "{raw}");
                assert!(n("drafted_steps") <= n("mtp_decodes"), "{raw}");
                assert!(n("mtp_accepted") <= n("mtp_drafted"), "{raw}");
            }
        }
        "DECIDE" => {
            for k in DECIDE_ZERO {
                assert_eq!(v[*k].as_f64(), Some(0.0), "{k}: {raw}");
            }
        }
        _ => {}
    }
    Line {
        tag: tag.to_owned(),
        v,
        raw: raw.to_owned(),
    }
}

/// The numbers of the array `key` of a printed line, each parsed exactly (Rust's `f64` parse
/// is correctly rounded, so a shortest round-trip print gives back the very bits; serde_json's
/// own number parsing does not promise that). `None` for a null.
fn exact_array(raw: &str, key: &str) -> Vec<Option<f64>> {
    let pat = format!("\"{key}\"");
    let at = raw
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {raw}"))
        + pat.len();
    let rest = raw[at..].trim_start();
    let rest = rest.strip_prefix(':').expect(raw).trim_start();
    let rest = rest.strip_prefix('[').expect(raw);
    let body = rest[..rest.find(']').expect(raw)].trim();
    if body.is_empty() {
        return Vec::new();
    }
    body.split(',')
        .map(|x| match x.trim() {
            "null" => None,
            n => Some(n.parse().unwrap_or_else(|_| panic!("{key}: {n}"))),
        })
        .collect()
}

// ---- a session driven through pipes ----

/// How long any one expected line may take before the test fails instead of hanging.
const LINE_TIMEOUT: Duration = Duration::from_secs(300);

struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Receiver<Result<String, Vec<u8>>>,
    err: Receiver<String>,
    err_log: Arc<Mutex<String>>,
    ready: Value,
    /// The process's `-n` (what a generate without `n_predict` targets).
    n_default: u64,
    /// `--overlap`: the only mode with stalls.
    overlap: bool,
}

/// A generate's answer: the `BMOE_DONE` object, the `BMOE_PROGRESS` and `BMOE_LOAD` objects
/// before it, and the text and reasoning the deltas add up to.
#[derive(Debug)]
struct Turn {
    done: Value,
    progress: Vec<Value>,
    loads: Vec<Value>,
}

impl Turn {
    fn text(&self) -> &str {
        self.done["text"].as_str().unwrap()
    }
    fn num(&self, key: &str) -> u64 {
        self.done[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} of {}", self.done))
    }
    fn cancelled(&self) -> bool {
        self.done["cancelled"].as_bool().unwrap()
    }
}

/// A decision's answer: the `BMOE_DECIDE` object and its `choice_logp`, exactly.
#[derive(Debug)]
struct Decision {
    v: Value,
    logp: Vec<Option<f64>>,
}

impl Decision {
    fn num(&self, key: &str) -> u64 {
        self.v[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} of {}", self.v))
    }
    fn bits(&self) -> Vec<Option<u64>> {
        self.logp.iter().map(|x| x.map(f64::to_bits)).collect()
    }
}

impl Session {
    /// `sluice run -m MODEL --session ARGS`, up to its `BMOE_READY` line.
    fn start(model: &Path, args: &[&str]) -> Session {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["run", "-m", model.to_str().unwrap(), "--session"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sluice");
        let stdout = child.stdout.take().unwrap();
        let (otx, out) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut buf = Vec::new();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if buf.last() == Some(&b'\n') {
                            buf.pop();
                        }
                        let line = String::from_utf8(buf).map_err(|e| e.into_bytes());
                        if otx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let stderr = child.stderr.take().unwrap();
        let (etx, err) = mpsc::channel();
        let err_log = Arc::new(Mutex::new(String::new()));
        let log = Arc::clone(&err_log);
        std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            loop {
                let mut buf = Vec::new();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf).into_owned();
                        log.lock().unwrap().push_str(&line);
                        // The receiver may be gone (a test that does not wait on stderr).
                        let _ = etx.send(line);
                    }
                }
            }
        });
        let n_default = args
            .iter()
            .position(|a| *a == "-n")
            .map_or(256, |i| args[i + 1].parse().unwrap());
        let stdin = child.stdin.take();
        let mut s = Session {
            child,
            stdin,
            out,
            err,
            err_log,
            ready: Value::Null,
            n_default,
            overlap: args.contains(&"--overlap"),
        };
        let l = s.next();
        assert_eq!(l.tag, "READY", "the first line: {}", l.raw);
        s.ready = l.v;
        s
    }

    fn stderr_so_far(&self) -> String {
        self.err_log.lock().unwrap().clone()
    }

    /// All of standard error once the process has closed it (for the message of a failure
    /// where standard output ended: the last lines may still be on their way).
    fn stderr_at_end(&mut self) -> String {
        while let Ok(_) | Err(RecvTimeoutError::Timeout) = self.err.recv_timeout(LINE_TIMEOUT) {
            if self.child.try_wait().ok().flatten().is_some() {
                // Exited: what remains is in the pipe, read by the time it disconnects.
                while self.err.recv_timeout(LINE_TIMEOUT).is_ok() {}
                break;
            }
        }
        self.stderr_so_far()
    }

    /// The next standard output line, parsed.
    fn next(&mut self) -> Line {
        match self.out.recv_timeout(LINE_TIMEOUT) {
            Ok(Ok(raw)) => parse_line(&raw),
            Ok(Err(bytes)) => panic!("standard output is not UTF-8: {bytes:?}"),
            Err(RecvTimeoutError::Timeout) => panic!(
                "no line on standard output in {LINE_TIMEOUT:?}; stderr:\n{}",
                self.stderr_so_far()
            ),
            Err(RecvTimeoutError::Disconnected) => {
                panic!("standard output ended; stderr:\n{}", self.stderr_at_end())
            }
        }
    }

    fn send(&mut self, line: &[u8]) {
        let w = self.stdin.as_mut().expect("stdin open");
        let r = w
            .write_all(line)
            .and_then(|()| w.write_all(b"\n"))
            .and_then(|()| w.flush());
        if let Err(e) = r {
            panic!("writing a request: {e}; stderr:\n{}", self.stderr_at_end());
        }
    }

    fn send_json(&mut self, req: &Value) {
        self.send(req.to_string().as_bytes());
    }

    /// Waits until a standard error line contains `needle`.
    fn wait_stderr(&mut self, needle: &str) -> String {
        loop {
            match self.err.recv_timeout(LINE_TIMEOUT) {
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(e) => panic!(
                    "{needle:?} never appeared on stderr ({e:?}):\n{}",
                    self.stderr_so_far()
                ),
            }
        }
    }

    /// Reads a generate's answer (`BMOE_BEGIN`, per-token lines, `BMOE_DONE`) and checks that
    /// it holds together: steps 1, 2, ... of one target, the deltas adding up to the final
    /// text and reasoning, one progress line per token, no stall in serial mode.
    fn finish_generate(&mut self, id: i64, steps: u64) -> Turn {
        let b = self.next();
        assert_eq!(b.tag, "BEGIN", "generate {id}: {}", b.raw);
        assert_eq!(b.v["id"], id, "{}", b.raw);
        self.finish_generate_after_begin(id, steps)
    }

    /// [`Session::finish_generate`] once its `BMOE_BEGIN` has been read.
    fn finish_generate_after_begin(&mut self, id: i64, steps: u64) -> Turn {
        let mut progress = Vec::new();
        let mut loads = Vec::new();
        let (mut text, mut reasoning) = (String::new(), String::new());
        let done = loop {
            let l = self.next();
            match l.tag.as_str() {
                "LOAD" => loads.push(l.v),
                "PROGRESS" => {
                    let v = l.v;
                    assert_eq!(v["step"], progress.len() as u64 + 1, "{}", l.raw);
                    assert_eq!(v["steps"], steps, "{}", l.raw);
                    if !self.overlap {
                        assert_eq!(v["stall_ms"], 0.0, "stall is overlap-only: {}", l.raw);
                    }
                    let (dt, dr) = (
                        v["delta_text"].as_str().unwrap(),
                        v["delta_reasoning"].as_str().unwrap(),
                    );
                    if v.get("reset").is_some() {
                        text = dt.to_owned();
                        reasoning = dr.to_owned();
                    } else {
                        text.push_str(dt);
                        reasoning.push_str(dr);
                    }
                    progress.push(v);
                }
                "DONE" => break l.v,
                _ => panic!("generate {id}: unexpected {}", l.raw),
            }
        };
        assert_eq!(done["id"], id, "{done}");
        assert_eq!(done["tokens"], progress.len() as u64, "{done}");
        assert_eq!(done["text"], text.as_str(), "the deltas make the text");
        assert_eq!(done["reasoning"], reasoning.as_str());
        if !self.overlap {
            assert_eq!(done["stall_s_tok"], 0.0, "{done}");
        }
        Turn {
            done,
            progress,
            loads,
        }
    }

    /// Sends a generate and reads its answer.
    fn generate(&mut self, req: &Value) -> Turn {
        self.send_json(req);
        let steps = req
            .get("n_predict")
            .map_or(self.n_default, |n| n.as_u64().unwrap());
        let t = self.finish_generate(req["id"].as_i64().unwrap(), steps);
        assert!(!t.cancelled(), "{}", t.done);
        t
    }

    /// Sends a decide and reads its answer: `BMOE_BEGIN`, then at once `BMOE_DECIDE`.
    fn decide(&mut self, req: &Value) -> Decision {
        self.send_json(req);
        let id = req["id"].as_i64().unwrap();
        let b = self.next();
        assert_eq!(b.tag, "BEGIN", "decide {id}: {}", b.raw);
        assert_eq!(b.v["id"], id);
        let l = self.next();
        assert_eq!(l.tag, "DECIDE", "decide {id}: nothing between: {}", l.raw);
        let v = l.v;
        assert_eq!(v["id"], id);
        assert_eq!(v["cancelled"], false);
        let logp = exact_array(&l.raw, "choice_logp");
        assert_eq!(logp.len(), req["choices"].as_array().unwrap().len());
        // best: the index of the highest
        let best = v["best"].as_u64().unwrap() as usize;
        let top = logp
            .iter()
            .flatten()
            .fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        assert_eq!(logp[best], Some(top), "{}", l.raw);
        let d = Decision { v, logp };
        assert_eq!(
            d.num("n_reused") + d.num("n_prefilled"),
            d.num("n_tokens"),
            "{}",
            l.raw
        );
        d
    }

    /// Sends `line` and expects its refusal: one `BMOE_ERROR`, fatal false, with `id`.
    fn refused(&mut self, line: &[u8], id: i64) -> Value {
        self.send(line);
        let l = self.next();
        assert_eq!(
            l.tag,
            "ERROR",
            "{} answered {}",
            String::from_utf8_lossy(line),
            l.raw
        );
        assert_eq!(l.v["id"], id, "{}", l.raw);
        assert_eq!(l.v["fatal"], false, "{}", l.raw);
        l.v
    }

    /// Ends the session (`{"cmd":"close"}`, or EOF on standard input): it must exit with
    /// status 0 and print nothing more.
    fn close(mut self, with_command: bool) {
        if with_command {
            self.send(br#"{"cmd":"close"}"#);
        }
        self.stdin = None;
        let mut rest = Vec::new();
        loop {
            match self.out.recv_timeout(LINE_TIMEOUT) {
                Ok(l) => rest.push(l),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("the session did not end:\n{}", self.stderr_so_far())
                }
            }
        }
        assert!(rest.is_empty(), "after the last answer: {rest:?}");
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "{status}; stderr:\n{}",
            self.stderr_so_far()
        );
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // A failed test must not leave its process behind (a no-op after `close`).
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn gen_req(id: i64, prompt: &str) -> Value {
    json!({"cmd": "generate", "id": id, "prompt": prompt})
}

// ---- models and the one-shot reference ----

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo-qwen3moe.gguf")
}

/// A small chat template: turns between `<|im_start|>` and `<|im_end|>`, an assistant's
/// reasoning inside `<think>`/`</think>` before its answer (as tests/run.rs's, with nothing
/// opened after the generation prompt).
const CHAT_TEMPLATE: &str = "{%- for m in messages -%}\
<|im_start|>{{ m.role }}\n\
{%- if m.role == 'assistant' and m.reasoning_content -%}\
<think>\n{{ m.reasoning_content }}\n</think>\n\n\
{%- endif -%}\
{{ m.content }}<|im_end|>\n\
{%- endfor -%}\
{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}";

/// A copy of the demo model with [`CHAT_TEMPLATE`] as its chat template.
fn demo_chat(dir: &Path) -> PathBuf {
    demo_with_template(dir, CHAT_TEMPLATE, "demo-chat.gguf")
}

/// The demo model with `template` as its chat template, written to `dir/name`.
fn demo_with_template(dir: &Path, template: &str, name: &str) -> PathBuf {
    let src = GgufFile::open(demo()).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in src.metadata().iter() {
        w.add_metadata(key, value.clone()).unwrap();
    }
    w.add_metadata(
        "tokenizer.chat_template",
        GgufValue::String(template.to_owned()),
    )
    .unwrap();
    for t in src.tensors() {
        let data = src.tensor_data(t).unwrap();
        w.add_tensor_raw(t.name.clone(), &t.dims, t.ty.id(), data)
            .unwrap();
    }
    let path = dir.join(name);
    w.write_to_path(&path).unwrap();
    path
}

/// A 2-layer OLMoE-shaped generated model (64 experts of 3.9 MiB per layer, top-8) with
/// [`CHAT_TEMPLATE`] as its chat template.
fn olmoe_chat(dir: &Path) -> PathBuf {
    let tmpl = dir.join("template.jinja");
    std::fs::write(&tmpl, CHAT_TEMPLATE).unwrap();
    let out = dir.join("olmoe-chat.gguf");
    let vocab = testdata::vocab_path("ggml-vocab-gpt-neox.gguf");
    ok(sluice(&[
        "gen-model",
        "--like",
        "olmoe-1b-7b",
        "--layers",
        "2",
        "--vocab",
        vocab.to_str().unwrap(),
        "--chat-template",
        tmpl.to_str().unwrap(),
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]));
    out
}

/// The ids `sluice tokenize ARGS` prints.
fn token_ids(args: &[&str]) -> Vec<u32> {
    let mut a = vec!["tokenize"];
    a.extend_from_slice(args);
    serde_json::from_str(&ok(sluice(&a))).unwrap()
}

/// A one-shot run's answer, its generated token count and its prompt's token count.
#[derive(Debug)]
struct OneShot {
    answer: String,
    tokens: u64,
    prompt: u64,
}

/// `sluice run ARGS --progress`, read from its `=== answer ===` / `=== perf ===` block,
/// `generation: <n> tokens, ...` line and the `prompt <n> tokens` of its standard error.
fn one_shot(args: &[&str]) -> OneShot {
    let mut a = vec!["run"];
    a.extend_from_slice(args);
    a.push("--progress");
    let o = sluice(&a);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let out = ok(o);
    let (_, rest) = out.split_once("=== answer ===\n").expect(&out);
    let (answer, perf) = rest.rsplit_once("\n=== perf ===\n").expect(&out);
    let g = perf
        .lines()
        .find_map(|l| l.strip_prefix("generation: "))
        .expect(perf);
    let tokens = g.split_once(" tokens, ").expect(g).0.parse().expect(g);
    let at = err.find("prompt ").expect(&err) + "prompt ".len();
    let prompt = err[at..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prompt count in {err}"));
    OneShot {
        answer: answer.to_owned(),
        tokens,
        prompt,
    }
}

/// The chat `messages` run in one shot (`--chatml --messages`), greedily, `n` tokens.
fn one_shot_chat(model: &Path, dir: &Path, messages: &[Value], n: u64, extra: &[&str]) -> OneShot {
    let f = dir.join("messages.json");
    std::fs::write(&f, Value::Array(messages.to_vec()).to_string()).unwrap();
    let n = n.to_string();
    let mut args = vec![
        "-m",
        model.to_str().unwrap(),
        "--chatml",
        "--messages",
        f.to_str().unwrap(),
        "--temp",
        "0",
        "--ignore-eos",
        "-n",
        &n,
    ];
    args.extend_from_slice(extra);
    one_shot(&args)
}

/// The log-softmax of `x` at `i`, as the interface defines a decision's score: in f64,
/// `m = max x`, `s = Σ exp(x_j - m)` in index order, `(x_i - m) - ln s`; None for -inf.
fn log_softmax_at(x: &[f32], i: usize) -> Option<f64> {
    let m = x
        .iter()
        .map(|&v| f64::from(v))
        .fold(f64::NEG_INFINITY, f64::max);
    let mut s = 0.0f64;
    for &v in x {
        s += (f64::from(v) - m).exp();
    }
    let r = (f64::from(x[i]) - m) - s.ln();
    (r != f64::NEG_INFINITY).then_some(r)
}

// ---- the tests ----

/// Greedy chat flags for the demo model.
const CHAT: &[&str] = &["--chatml", "--temp", "0", "--ignore-eos"];

fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(extra).copied().collect()
}

/// A 4-turn greedy conversation, continued with `clear_kv:false`: turn by turn the same text
/// and token count as a one-shot `run --chatml --messages` over the same history (user
/// messages and the previous answers), while prefilling fewer tokens than that one-shot's
/// prompt from the second turn on, and a context that grows by the turn.
///
/// Both run with `--ubatch 1`: the session decoded the previous answers one token at a time
/// while the one-shot prefills them, and (as in llama.cpp) a product over several rows rounds
/// differently from one over a single row, so only one-token passes make the two contexts the
/// same bits (docs/session.md); the test then demands exactly the same tokens.
#[test]
fn a_continued_conversation_answers_as_a_one_shot_over_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_chat(dir.path());
    let mut s = Session::start(&m, &with(CHAT, &["-n", "6", "--ubatch", "1"]));
    assert_eq!(s.ready["arch"], "qwen3moe");
    assert_eq!(s.ready["n_expert_used"], 2);
    let turns: [(&str, Option<u64>); 4] = [
        ("Hello there, who are you?", None),
        ("Tell me more about that.", Some(4)),
        ("Why?", Some(8)),
        ("And then what happened next?", Some(5)),
    ];
    let mut history: Vec<Value> = Vec::new();
    let mut prev_past = 0;
    for (k, (prompt, n)) in turns.iter().enumerate() {
        let id = k as i64 + 1;
        let mut req = gen_req(id, prompt);
        if let Some(n) = n {
            req["n_predict"] = json!(n);
        }
        if k > 0 {
            req["clear_kv"] = json!(false);
        }
        let t = s.generate(&req);
        let n = n.unwrap_or(6);
        assert_eq!(t.num("tokens"), n, "turn {k}");
        assert_eq!(
            t.done["reasoning"], "",
            "turn {k}: nothing opens a reasoning span"
        );
        history.push(json!({"role": "user", "content": prompt}));
        let o = one_shot_chat(&m, dir.path(), &history, n, &["--ubatch", "1"]);
        assert_eq!(t.text(), o.answer, "turn {k}: {history:?}");
        assert_eq!(t.num("tokens"), o.tokens, "turn {k}");
        let (n_prompt, n_past) = (t.num("n_prompt"), t.num("n_past"));
        if k == 0 {
            assert_eq!(n_prompt, o.prompt, "a new chat prefills its whole prompt");
        } else {
            assert!(n_prompt < o.prompt, "turn {k}: {n_prompt} vs {}", o.prompt);
            // What was not prefilled was reused, out of what the context held.
            assert!(n_prompt + prev_past >= o.prompt, "turn {k}");
        }
        // The context after the turn: the prompt and the answer (its last token possibly not
        // yet run).
        let total = o.prompt + o.tokens;
        assert!(
            n_past == total || n_past + 1 == total,
            "turn {k}: {n_past} vs {total}"
        );
        assert!(n_past > prev_past, "turn {k}");
        prev_past = n_past;
        history.push(json!({"role": "assistant", "content": t.text()}));
    }
    s.close(false);
}

/// A generate cancelled while held (`--test-hold`) in prefill and in decode ends with
/// `cancelled:true`, and the conversation then answers exactly as a session that never saw the
/// cancelled turn; a cancel with nothing in flight is ignored.
#[test]
fn a_cancelled_turn_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_chat(dir.path());
    let mp = m.to_str().unwrap();
    let first = "Hi";
    // The first turn must not reach the hold: its prompt fits in the chunks before it.
    let p1 = token_ids(&["-m", mp, "--chatml", first]).len();
    let chunk_k = p1.div_ceil(4) + 1;
    let long = "Please tell me a long story about a cat who sat on a mat, then went \
        out to the garden, met a dog and a bird there, and came back home again in the evening \
        to sleep by the fire until the morning sun rose over the hills and the river.";
    let last = "What next?";
    let flags = with(CHAT, &["-n", "6", "--ubatch", "4"]);
    for (hold, cut) in [
        (format!("prefill:{chunk_k}"), None),
        ("decode:3".to_owned(), Some(3)),
    ] {
        let mut args = flags.clone();
        args.extend(["--test-hold", hold.as_str()]);
        let mut a = Session::start(&m, &args);
        let a1 = a.generate(&json!({"cmd": "generate", "id": 1, "prompt": first, "n_predict": 2}));
        let held = json!({"cmd": "generate", "id": 2, "prompt": long, "n_predict": 8,
            "clear_kv": false});
        a.send_json(&held);
        a.wait_stderr("test hold");
        a.send(br#"{"cmd":"cancel"}"#);
        let a2 = a.finish_generate(2, 8);
        assert!(a2.cancelled(), "{hold}: {}", a2.done);
        match cut {
            // Cancelled before anything was sampled.
            None => assert_eq!(a2.num("tokens"), 0, "{hold}"),
            // Held with K tokens sampled.
            Some(k) => assert!(
                (k - 1..=k).contains(&a2.num("tokens")),
                "{hold}: {}",
                a2.done
            ),
        }
        // Nothing in flight: ignored (no line, and the next turn is not cancelled).
        a.send(br#"{"cmd":"cancel"}"#);
        let next = json!({"cmd": "generate", "id": 3, "prompt": last, "clear_kv": false});
        let a3 = a.generate(&next);
        assert_eq!(a3.num("tokens"), 6);
        a.close(true);

        let mut b = Session::start(&m, &flags);
        let b1 = b.generate(&json!({"cmd": "generate", "id": 1, "prompt": first, "n_predict": 2}));
        assert_eq!(a1.text(), b1.text());
        let b3 = b.generate(&next);
        assert_eq!(a3.text(), b3.text(), "{hold}");
        assert_eq!(a3.num("tokens"), b3.num("tokens"), "{hold}");
        assert_eq!(a3.num("n_past"), b3.num("n_past"), "{hold}");
        b.close(false);
    }
}

const PREFIX: &str = "Task: pick the best option for the user. History: none yet. ";
const SUFFIX_1: &str =
    "Screen: home. Options: A) Settings B) Camera C) Phone. Answer with the letter.";
const SUFFIX_2: &str =
    "Screen: settings. Options: A) Network B) Display C) Battery. Answer with the letter.";
const CHOICES: [&str; 3] = ["A", "B", "C"];

fn decide_req(id: i64, prefix: &str, suffix: &str) -> Value {
    json!({"cmd": "decide", "id": id, "prefix": prefix, "suffix": suffix, "choices": CHOICES})
}

/// A decision's scores: bit for bit the f64 log-softmax of `sluice logits --last` over the
/// rendered prompt (prefilled whole with `reuse_prefix:false`, and with the cache off); a
/// restored prefix scores what a fresh session computing it scores.
#[test]
fn decisions_score_the_logits_and_a_restored_prefix_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_chat(dir.path());
    let mp = m.to_str().unwrap();
    let first: Vec<u32> = CHOICES
        .iter()
        .map(|c| token_ids(&["-m", mp, "--no-bos", c])[0])
        .collect();
    let flags = with(CHAT, &["-n", "4", "--decide"]);

    // The whole prompt in one piece equals the logits command's last row.
    for (cache, req_extra) in [("on", Some(false)), ("off", None)] {
        let mut args = flags.clone();
        args.extend(["--decide-prefix-cache", cache]);
        let mut s = Session::start(&m, &args);
        let n_ctx = s.ready["n_ctx"].as_u64().unwrap().to_string();
        for (id, suffix) in [(1, SUFFIX_1), (2, SUFFIX_2)] {
            let mut req = decide_req(id, PREFIX, suffix);
            if let Some(r) = req_extra {
                req["reuse_prefix"] = json!(r);
            }
            let d = s.decide(&req);
            let ids = token_ids(&[
                "-m",
                mp,
                "--chatml",
                "--no-think",
                &format!("{PREFIX}{suffix}"),
            ]);
            assert_eq!(d.num("n_tokens"), ids.len() as u64, "{}", d.v);
            assert_eq!(d.num("n_reused"), 0, "{cache}: nothing kept: {}", d.v);
            assert_eq!(d.num("n_prefilled"), ids.len() as u64);
            let npy = dir.path().join(format!("last-{cache}-{id}.npy"));
            let list: Vec<String> = ids.iter().map(u32::to_string).collect();
            ok(sluice(&[
                "logits",
                "-m",
                mp,
                "--tokens",
                &list.join(","),
                "--last",
                "-c",
                &n_ctx,
                "--out",
                npy.to_str().unwrap(),
            ]));
            let (shape, x) = read_npy(&npy);
            assert_eq!(shape, [1, 275]);
            let want: Vec<Option<u64>> = first
                .iter()
                .map(|&t| log_softmax_at(&x, t as usize).map(f64::to_bits))
                .collect();
            assert_eq!(d.bits(), want, "{cache} decide {id}: {:?}", d.logp);
        }
        s.close(true);
    }

    // Session A: P+S1, then P+S2 restoring P; session B: P+S2 first. Same scores, bit for bit.
    let mut args = flags.clone();
    args.extend(["--decide-prefix-cache", "on"]);
    let mut a = Session::start(&m, &args);
    let a1 = a.decide(&decide_req(1, PREFIX, SUFFIX_1));
    assert_eq!(a1.num("n_reused"), 0);
    let a2 = a.decide(&decide_req(2, PREFIX, SUFFIX_2));
    assert!(a2.num("n_reused") > 0, "the prefix restored: {}", a2.v);
    a.close(false);
    let mut b = Session::start(&m, &args);
    let b2 = b.decide(&decide_req(7, PREFIX, SUFFIX_2));
    assert_eq!(b2.num("n_reused"), 0);
    assert_eq!(a2.bits(), b2.bits(), "{:?} vs {:?}", a2.logp, b2.logp);
    assert_eq!(a2.v["best"], b2.v["best"]);
    assert_eq!(a2.num("n_tokens"), b2.num("n_tokens"));
    b.close(false);
}

/// Colliding choices, no choices, a prompt past the context, a generate past it, and a decide
/// without `--decide` are each refused with one `BMOE_ERROR` (fatal false) before any
/// `BMOE_BEGIN`; a conversation after decisions and refusals answers as one that never saw
/// them, and the next decision after a chat turn starts from no kept state.
#[test]
fn refused_requests_and_decisions_leave_the_session_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_chat(dir.path());
    let mp = m.to_str().unwrap();
    // Two labels whose first tokens are one token.
    let ab = token_ids(&["-m", mp, "--no-bos", "Ab"]);
    let ac = token_ids(&["-m", mp, "--no-bos", "Ac"]);
    assert_eq!(ab[0], ac[0]);
    let flags = with(CHAT, &["-n", "4"]);
    let g1 = json!({"cmd": "generate", "id": 20, "prompt": "Good morning!", "clear_kv": false});
    let g2 = json!({"cmd": "generate", "id": 21, "prompt": "And you?", "clear_kv": false});

    let mut c = Session::start(&m, &with(&flags, &["--decide"]));
    let n_ctx = c.ready["n_ctx"].as_u64().unwrap() as usize;
    let first = c.decide(&decide_req(9, PREFIX, SUFFIX_1));
    assert_eq!(first.num("n_reused"), 0);
    let decide_with = |id: i64, prefix: &str, choices: Value| {
        json!({"cmd": "decide", "id": id, "prefix": prefix, "suffix": SUFFIX_1,
            "choices": choices})
        .to_string()
    };
    c.refused(decide_with(10, PREFIX, json!(["A", "A"])).as_bytes(), 10);
    c.refused(decide_with(11, PREFIX, json!(["Ab", "Ac"])).as_bytes(), 11);
    c.refused(decide_with(12, PREFIX, json!([])).as_bytes(), 12);
    c.refused(
        decide_with(13, &"x ".repeat(n_ctx), json!(["A", "B"])).as_bytes(),
        13,
    );
    let past = json!({"cmd": "generate", "id": 14, "prompt": "Hi", "n_predict": n_ctx});
    c.refused(past.to_string().as_bytes(), 14);
    let c1 = c.generate(&g1);
    let c2 = c.generate(&g2);
    // A chat turn drops the kept prefix state.
    let after = c.decide(&decide_req(22, PREFIX, SUFFIX_2));
    assert_eq!(after.num("n_reused"), 0, "{}", after.v);
    c.close(true);

    // Without --decide: refused, harmlessly.
    let mut d = Session::start(&m, &flags);
    d.refused(decide_req(5, PREFIX, SUFFIX_1).to_string().as_bytes(), 5);
    let d1 = d.generate(&g1);
    let d2 = d.generate(&g2);
    d.close(false);

    let mut f = Session::start(&m, &flags);
    let f1 = f.generate(&g1);
    let f2 = f.generate(&g2);
    f.close(false);

    for (x, y, z) in [(&c1, &d1, &f1), (&c2, &d2, &f2)] {
        for key in ["text", "tokens", "n_prompt", "n_past"] {
            assert_eq!(y.done[key], z.done[key], "{key}: after a refused decide");
            // The first turn after a decision may reuse the rendered turn's opening from the
            // decision's KV: it may prefill less, nothing else.
            if key == "n_prompt" && std::ptr::eq(x, &c1) {
                assert!(x.done[key].as_u64() <= z.done[key].as_u64());
                continue;
            }
            assert_eq!(
                x.done[key], z.done[key],
                "{key}: after decisions and refusals"
            );
        }
    }
}

// ---- hostile request lines ----

/// The id a `BMOE_ERROR` must carry for a request line: a blank line (see the module doc); -1
/// when no id can be read (not JSON, not an object, no integer id); the id itself when it is
/// a non-negative integer of i64; either for an integer outside that (negative, or past
/// i64::MAX), whose readability the spec leaves open.
#[derive(Debug)]
enum IdRule {
    Blank,
    MinusOne,
    Exact(Value),
    Either(Value),
}

fn id_rule(line: &[u8]) -> IdRule {
    if line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
        return IdRule::Blank;
    }
    let Ok(v) = serde_json::from_slice::<Value>(line) else {
        return IdRule::MinusOne;
    };
    match v.get("id") {
        Some(id) if id.as_i64().is_some_and(|x| x >= 0) => IdRule::Exact(id.clone()),
        Some(id) if id.is_i64() || id.is_u64() => IdRule::Either(id.clone()),
        _ => IdRule::MinusOne,
    }
}

/// Whether `v` is a request the spec would have the session carry out here (a raw session
/// without --decide, n_ctx 512): a generate of the spec's keys and types with a short prompt
/// and a small n_predict, or a cancel/close. No hostile line may be one.
fn would_run(v: &Value) -> bool {
    let Some(o) = v.as_object() else {
        return false;
    };
    match o.get("cmd").and_then(Value::as_str) {
        Some("cancel" | "close") => true,
        Some("generate") => {
            o.keys()
                .all(|k| GENERATE_REQUEST.iter().any(|(n, _)| n == k))
                && GENERATE_REQUEST.iter().all(|(k, ty)| {
                    o.get(*k)
                        .map_or(!matches!(*k, "cmd" | "id" | "prompt"), |x| has_type(x, ty))
                })
                && o["id"].as_i64().is_some_and(|x| x >= 0)
                && o["prompt"].as_str().is_some_and(|p| p.len() < 200)
                && o.get("n_predict")
                    .is_none_or(|n| n.as_i64().is_some_and(|n| (0..100).contains(&n)))
        }
        _ => false,
    }
}

/// One round of hostile request lines, ids from `base`. The 1 MB lines only when `big`.
fn hostile_round(base: i64, big: bool) -> Vec<Vec<u8>> {
    let mut n = 0;
    let mut id = || {
        n += 1;
        base + n
    };
    let mut v: Vec<Vec<u8>> = Vec::new();
    let mut t = |s: String| v.push(s.into_bytes());
    // not JSON
    t("hello".into());
    t("{".into());
    t("}".into());
    t("{{}}".into());
    t(format!(r#"{{"cmd":"generate","id":{},"prompt":"x""#, id()));
    t(format!(
        r#"{{"cmd":"generate","id":{},"prompt":"x",}}"#,
        id()
    ));
    t(format!("{{'cmd':'generate','id':{},'prompt':'x'}}", id()));
    t(format!(
        r#"{{"cmd":"generate","id":{},"prompt":"x"}} trailing"#,
        id()
    ));
    let i = id();
    t(format!(
        r#"{{"cmd":"generate","id":{i},"prompt":"x"}}{{"cmd":"generate","id":{i},"prompt":"y"}}"#
    ));
    t(r#"{"cmd":"generate","id":NaN,"prompt":"x"}"#.into());
    t(format!(
        r#"{{"cmd":"generate","id":{},"prompt":"x","n_predict":Infinity}}"#,
        id()
    ));
    t(r#"{"cmd":"generate","id":1e400,"prompt":"x"}"#.into());
    t(format!(
        r#"{{"cmd":"generate","id":{},"prompt":"x","n_predict":1e400}}"#,
        id()
    ));
    t(format!(
        r#"{{"cmd":"generate","id":{},"prompt":"x","n_predict":-1e400}}"#,
        id()
    ));
    t(r#"{"cmd":"generate","id":007,"prompt":"x"}"#.into());
    t(format!(
        r#"{{"cmd":"generate","id":+{},"prompt":"x"}}"#,
        id()
    ));
    t(r#"{"cmd":"generate","id":0x10,"prompt":"x"}"#.into());
    t(format!(
        r#"{{"cmd":"generate" /* c */,"id":{},"prompt":"x"}}"#,
        id()
    ));
    t(format!(
        "{{\"cmd\":\"generate\",\"id\":{},\"prompt\":\"a\tb\"}}",
        id()
    ));
    t(format!(
        r#"{{"cmd":"generate","id":{},"prompt":"\x"}}"#,
        id()
    ));
    t(format!(
        r#"{{"cmd":"generate","id":{},"prompt":"\ud800"}}"#,
        id()
    ));
    t(
        format!(r#"{{"cmd":"generate","id":{},"prompt":"x"}}"#, id())
            .replace("generate", "gen\"erate"),
    );
    t(format!("{}{}", "[".repeat(5000), "]".repeat(5000)));
    t(format!(
        r#"{{"cmd":"generate","id":{},"prompt":{}1{}}}"#,
        id(),
        r#"{"a":"#.repeat(300),
        "}".repeat(300)
    ));
    t("1e400".into());
    // raw NUL bytes and invalid UTF-8
    let raw = |b: Vec<u8>| b;
    let mut bytes: Vec<Vec<u8>> = Vec::new();
    bytes.push(raw(format!(
        r#"{{"cmd":"generate","id":{},"prompt":"a"#,
        id()
    )
    .into_bytes()
    .into_iter()
    .chain(*b"\0b\"}")
    .collect()));
    bytes.push(raw([
        &b"\0"[..],
        format!(r#"{{"cmd":"generate","id":{},"prompt":"x"}}"#, id()).as_bytes(),
    ]
    .concat()));
    bytes.push(raw(b"\0".to_vec()));
    bytes.push(raw([
        &br#"{"cmd":"generate","id":7,"#[..],
        b"\0",
        br#""prompt":"x"}"#,
    ]
    .concat()));
    bytes.push(raw([
        format!(r#"{{"cmd":"generate","id":{},"prompt":""#, id()).as_bytes(),
        b"\xff\xfe",
        b"\"}",
    ]
    .concat()));
    bytes.push(raw([
        format!(r#"{{"cmd":"generate","id":{},"pr"#, id()).as_bytes(),
        b"\xc0\xaf",
        br#"ompt":"x"}"#,
    ]
    .concat()));
    bytes.push(raw([
        format!(r#"{{"cmd":"generate","id":{},"prompt":"x"}}"#, id()).as_bytes(),
        b"\xe2\x82",
    ]
    .concat()));
    bytes.push(raw(b"\xef\xbb\xbf{\"cmd\":\"nope\"}".to_vec()));
    bytes.push(raw(b"\x80\x81\x82\xff".to_vec()));
    // not an object
    for s in [
        "null",
        "true",
        "false",
        "42",
        "-1",
        "3.5",
        r#""generate""#,
        "[]",
        "99999999999999999999",
    ] {
        t(s.into());
    }
    t(format!(
        r#"[{{"cmd":"generate","id":{},"prompt":"x"}}]"#,
        id()
    ));
    // objects: the command
    t("{}".into());
    t(format!(r#"{{"id":{}}}"#, id()));
    t(r#"{"cmd":"generate"}"#.into());
    t(r#"{"cmd":"generate","prompt":"x"}"#.into());
    t(format!(r#"{{"cmd":"generate","id":{}}}"#, id()));
    t(format!(r#"{{"cmd":"frobnicate","id":{}}}"#, id()));
    t(format!(r#"{{"cmd":"","id":{}}}"#, id()));
    t(format!(
        r#"{{"cmd":"GENERATE","id":{},"prompt":"x"}}"#,
        id()
    ));
    t(r#"{"cmd":"Close"}"#.into());
    t(r#"{"cmd":"CANCEL"}"#.into());
    t(r#"{"cmd":"close\u0000"}"#.into());
    t(r#"{"cmd":" close"}"#.into());
    t(format!(
        r#"{{"cmd":"generate ","id":{},"prompt":"x"}}"#,
        id()
    ));
    t(format!(r#"{{"cmd":"générer","id":{},"prompt":"x"}}"#, id()));
    t(format!(r#"{{"cmd":null,"id":{}}}"#, id()));
    t(format!(r#"{{"cmd":1,"id":{}}}"#, id()));
    t(format!(
        r#"{{"cmd":["generate"],"id":{},"prompt":"x"}}"#,
        id()
    ));
    t(format!(r#"{{"cmd":{{"name":"generate"}},"id":{}}}"#, id()));
    t(format!(
        r#"{{"command":"generate","id":{},"prompt":"x"}}"#,
        id()
    ));
    // the id
    t(format!(
        r#"{{"cmd":"generate","id":"{}","prompt":"x"}}"#,
        id()
    ));
    t(format!(
        r#"{{"cmd":"generate","id":{}.5,"prompt":"x"}}"#,
        id()
    ));
    t(r#"{"cmd":"generate","id":true,"prompt":"x"}"#.into());
    t(r#"{"cmd":"generate","id":null,"prompt":"x"}"#.into());
    t(format!(
        r#"{{"cmd":"generate","id":[{}],"prompt":"x"}}"#,
        id()
    ));
    t(r#"{"cmd":"generate","id":99999999999999999999,"prompt":"x"}"#.into());
    t(r#"{"cmd":"generate","id":18446744073709551615,"prompt":"x"}"#.into());
    t(format!(
        r#"{{"cmd":"generate","id":-{},"prompt":"x"}}"#,
        id()
    ));
    t(format!(
        r#"{{"cmd":"generate","id":-{},"prompt":"x","bogus":1}}"#,
        id()
    ));
    t(r#"{"cmd":"generate","id":-9223372036854775808,"prompt":"x"}"#.into());
    t(r#"{"cmd":"nope","id":9223372036854775807}"#.into());
    t(r#"{"cmd":"generate","id":0}"#.into());
    // the prompt
    for p in ["1", "null", "[]", "{}", "true", r#"["x"]"#] {
        t(format!(
            r#"{{"cmd":"generate","id":{},"prompt":{p}}}"#,
            id()
        ));
    }
    t(format!(
        r#"{{"cmd":"generate","id":{},"prompt":"{}"}}"#,
        id(),
        "x y ".repeat(400)
    ));
    // n_predict, think, clear_kv
    for (k, x) in [
        ("n_predict", r#""4""#),
        ("n_predict", "4.5"),
        ("n_predict", "true"),
        ("n_predict", "[4]"),
        ("n_predict", "99999999999999999999"),
        ("n_predict", "1000000"),
        ("n_predict", "9223372036854775807"),
        ("n_predict", "18446744073709551615"),
        ("think", r#""yes""#),
        ("think", "1"),
        ("think", r#""true""#),
        ("think", "[true]"),
        ("clear_kv", r#""false""#),
        ("clear_kv", "0"),
        ("clear_kv", "{}"),
    ] {
        t(format!(
            r#"{{"cmd":"generate","id":{},"prompt":"x","{k}":{x}}}"#,
            id()
        ));
    }
    // unknown keys
    for (k, x) in [
        ("temperature", "0.5"),
        ("", "1"),
        ("prompt ", r#""x""#),
        ("reuse_prefix", "true"),
        ("choices", r#"["A"]"#),
        ("prefix", r#""a""#),
        ("extra", "null"),
        ("seed", "1"),
        ("ID", "1"),
    ] {
        t(format!(
            r#"{{"cmd":"generate","id":{},"prompt":"x","{k}":{x}}}"#,
            id()
        ));
    }
    t(format!(
        r#"{{"cmd":"generate","id":{},"Prompt":"x"}}"#,
        id()
    ));
    t(format!(
        r#"{{"cmd":"generate","id":{},"prompt":"x","{}":1}}"#,
        id(),
        "k".repeat(10_000)
    ));
    t(format!(
        r#"{{"cmd":"generate","id":{},"prompt":"a\u0000b","bogus":1}}"#,
        id()
    ));
    t(format!(
        r#"{{"cmd":"generate","id":{},"prompt":"a\nb","n_predict":4,"bogus":1}}"#,
        id()
    ));
    // decisions, in a session without --decide
    t(decide_req(id(), PREFIX, SUFFIX_1).to_string());
    t(format!(
        r#"{{"cmd":"decide","id":{},"prefix":"a","suffix":"b","choices":[]}}"#,
        id()
    ));
    t(format!(
        r#"{{"cmd":"decide","id":{},"prefix":"a","suffix":"b","choices":"A"}}"#,
        id()
    ));
    t(format!(
        r#"{{"cmd":"decide","id":{},"prefix":"a","suffix":"b","choices":["A"],"think":false}}"#,
        id()
    ));
    t(format!(
        r#"{{"cmd":"decide","id":{},"prefix":"a","choices":["A","B"]}}"#,
        id()
    ));
    t(format!(
        r#"{{"cmd":"decide","id":{},"prompt":"a","choices":["A","B"]}}"#,
        id()
    ));
    // whitespace around, a carriage return, and blank lines
    t(format!(r#"   {{"cmd":"nope","id":{}}}   "#, id()));
    t(format!("{{\"cmd\":\"nope\",\"id\":{}}}\r", id()));
    t(String::new());
    t("   \t ".into());
    t("\r".into());
    if big {
        let mb = 1 << 20;
        t("x".repeat(mb));
        t(format!(
            r#"{{"cmd":"generate","id":{},"prompt":"x","pad":"{}"}}"#,
            id(),
            "a".repeat(mb)
        ));
        t(format!(
            r#"{{"cmd":"generate","id":{},"prompt":"{}"}}"#,
            id(),
            "the cat sat ".repeat(mb / 12)
        ));
        t("[".repeat(mb));
    }
    v.extend(bytes);
    v
}

/// 200 malformed or hostile request lines, each answered by exactly one non-fatal
/// `BMOE_ERROR` carrying its id (or -1), in order and before anything else; the session then
/// answers a valid generate exactly as a fresh session does, and as a one-shot run of the same
/// raw prompt.
#[test]
fn hostile_lines_are_each_refused_and_the_session_survives() {
    let mut lines = hostile_round(1000, true);
    let mut round = 1;
    while lines.len() < 200 {
        lines.extend(hostile_round(1000 * (round + 1), false));
        round += 1;
    }
    lines.truncate(200);
    let rules: Vec<IdRule> = lines.iter().map(|l| id_rule(l)).collect();
    for l in &lines {
        assert!(!l.contains(&b'\n'), "one line each");
        if let Ok(v) = serde_json::from_slice::<Value>(l) {
            assert!(!would_run(&v), "not a hostile line: {v}");
        }
    }
    let count = |f: fn(&IdRule) -> bool| rules.iter().filter(|r| f(r)).count();
    let blanks = count(|r| matches!(r, IdRule::Blank));
    // Every kind is there.
    assert!(blanks > 0);
    assert!(count(|r| matches!(r, IdRule::MinusOne)) > 20);
    assert!(count(|r| matches!(r, IdRule::Exact(_))) > 20);
    assert!(count(|r| matches!(r, IdRule::Either(_))) > 0);

    let flags = ["--temp", "0", "--ignore-eos", "-n", "4"];
    let prompt = "Once upon a time";
    let m = demo();
    let mut s = Session::start(&m, &flags);
    for l in &lines {
        s.send(l);
    }
    s.send_json(&gen_req(9999, prompt));
    let mut errors = Vec::new();
    loop {
        let l = s.next();
        if l.tag == "BEGIN" {
            assert_eq!(l.v["id"], 9999, "{}", l.raw);
            break;
        }
        assert_eq!(
            l.tag, "ERROR",
            "only errors answer hostile lines: {}",
            l.raw
        );
        assert_eq!(l.v["fatal"], false, "{}", l.raw);
        errors.push(l.v);
    }
    let done = s.finish_generate_after_begin(9999, 4).done;
    s.close(true);

    let answered = lines.len() - blanks;
    let blank_answered = if errors.len() == answered {
        false
    } else {
        assert_eq!(
            errors.len(),
            lines.len(),
            "one error per non-blank line ({answered}), or per line ({}), got {}",
            lines.len(),
            errors.len()
        );
        true
    };
    let mut e = errors.iter();
    for (l, r) in lines.iter().zip(&rules) {
        let shown = String::from_utf8_lossy(&l[..l.len().min(120)]).into_owned();
        let got = match r {
            IdRule::Blank if !blank_answered => continue,
            _ => &e.next().unwrap()["id"],
        };
        match r {
            IdRule::Blank | IdRule::MinusOne => assert_eq!(got, -1, "{shown}"),
            IdRule::Exact(id) => assert_eq!(got, id, "{shown}"),
            IdRule::Either(id) => assert!(got == id || got == -1, "{shown}: {got}"),
        }
    }

    // The surviving session's answer is a fresh session's, and the one-shot run's.
    let mut f = Session::start(&m, &flags);
    let fresh = f.generate(&gen_req(9999, prompt));
    f.close(false);
    for key in ["text", "tokens", "n_prompt", "n_past"] {
        assert_eq!(done[key], fresh.done[key], "{key}");
    }
    let o = one_shot(&[
        "-m",
        m.to_str().unwrap(),
        "-p",
        prompt,
        "--temp",
        "0",
        "--ignore-eos",
        "-n",
        "4",
    ]);
    assert_eq!(fresh.text(), o.answer);
    assert_eq!(fresh.num("n_prompt"), o.prompt);
}

/// The same session script (two chat turns, continued; two decisions, the second restoring the
/// prefix; a turn continuing after them; a new chat) answers the same resident and streaming
/// through an evicting cache: texts, token counts, prefill counts and scores bit for bit.
#[test]
fn resident_and_streaming_sessions_answer_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe_chat(dir.path());
    let base = [
        "--chatml",
        "--decide",
        "--temp",
        "0",
        "--ignore-eos",
        "-n",
        "4",
    ];
    let script = |s: &mut Session| -> (Vec<Turn>, Vec<Decision>) {
        let mut turns = Vec::new();
        let mut decisions = Vec::new();
        turns.push(s.generate(&gen_req(1, "Hello, how are you today?")));
        turns.push(s.generate(
            &json!({"cmd": "generate", "id": 2, "prompt": "Tell me more.",
            "clear_kv": false}),
        ));
        decisions.push(s.decide(&decide_req(3, PREFIX, SUFFIX_1)));
        decisions.push(s.decide(&decide_req(4, PREFIX, SUFFIX_2)));
        turns.push(
            s.generate(&json!({"cmd": "generate", "id": 5, "prompt": "Go on.",
            "clear_kv": false, "n_predict": 3})),
        );
        turns.push(s.generate(&gen_req(6, "A new question.")));
        (turns, decisions)
    };
    let mut r = Session::start(&m, &with(&base, &["--moe-stream", "off"]));
    assert_eq!(r.ready["arch"], "olmoe");
    assert_eq!(r.ready["n_expert_used"], 8);
    let (rt, rd) = script(&mut r);
    r.close(true);
    // Streaming through an evicting cache, serial and overlapped.
    for overlap in [&[][..], &["--overlap"][..]] {
        let stream = ["--moe-stream", "on", "--cache-mb", "10", "--force-cache"];
        let mut s = Session::start(&m, &with(&with(&base, &stream), overlap));
        let (st, sd) = script(&mut s);
        s.close(true);
        same_answers(&rt, &rd, &st, &sd);
    }
}

/// The resident session's turns and decisions (`rt`, `rd`) against a streaming one's.
fn same_answers(rt: &[Turn], rd: &[Decision], st: &[Turn], sd: &[Decision]) {
    assert!(rd[1].num("n_reused") > 0, "{}", rd[1].v);
    for (a, b) in rt.iter().zip(st) {
        for key in ["text", "reasoning", "tokens", "n_prompt", "n_past"] {
            assert_eq!(a.done[key], b.done[key], "{key}: {} vs {}", a.done, b.done);
        }
        // Resident: nothing read, the prefill split 0; streaming through 10 MiB: reads.
        assert!(a.loads.is_empty());
        for key in [
            "read_mib",
            "prefill_read_mib",
            "prefill_io_s",
            "prefill_stall_s",
        ] {
            assert_eq!(a.done[key], 0.0, "{key}: {}", a.done);
        }
        assert!(
            a.progress
                .iter()
                .all(|p| p["cache_hit_pct"] == -1.0 && p["read_mb"] == 0.0)
        );
        assert!(!b.loads.is_empty(), "{}", b.done);
        assert!(b.done["read_mib"].as_f64().unwrap() > 0.0, "{}", b.done);
        assert!(
            b.done["prefill_read_mib"].as_f64().unwrap() > 0.0,
            "{}",
            b.done
        );
        let budget = b.done["cache_budget_mib"].as_f64().unwrap();
        assert!(budget > 0.0 && budget <= 10.0, "{}", b.done);
        for p in &b.progress {
            let hit = p["cache_hit_pct"].as_f64().unwrap();
            assert!((0.0..=100.0).contains(&hit), "{p}");
        }
    }
    for (a, b) in rd.iter().zip(sd) {
        assert_eq!(a.v["prefill_read_mib"], 0.0, "{}", a.v);
        assert!(b.v["prefill_read_mib"].as_f64().unwrap() > 0.0, "{}", b.v);
        assert_eq!(a.bits(), b.bits(), "{:?} vs {:?}", a.logp, b.logp);
        for key in ["best", "n_tokens", "n_reused", "n_prefilled"] {
            assert_eq!(a.v[key], b.v[key], "{key}");
        }
    }
}

/// A CSV row or `# summary` line, by column or key name.
type Row = std::collections::BTreeMap<String, f64>;

/// Parses a session's `--csv` file with the spec's columns: the preamble once, the column line
/// once, then for every turn its rows and a `# summary` line; returns a few preamble values
/// and the turns' rows and summaries.
fn parse_session_csv(text: &str) -> (Row, Vec<(Vec<Row>, Row)>) {
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "# bmoe_metrics v2");
    assert_eq!(
        lines.iter().filter(|l| **l == "# bmoe_metrics v2").count(),
        1,
        "the preamble once"
    );
    assert!(lines[1].starts_with("# engine="), "{}", lines[1]);
    assert!(lines[2].starts_with("# model="), "{}", lines[2]);
    let mut preamble = std::collections::BTreeMap::new();
    let mut i = 1;
    while lines[i].starts_with('#') {
        for p in lines[i].trim_start_matches('#').split_whitespace() {
            if let Some((k, v)) = p.split_once('=') {
                preamble.insert(k.to_owned(), v.to_owned());
            }
        }
        i += 1;
    }
    for k in PREAMBLE_MODEL
        .iter()
        .chain(PREAMBLE_STREAM)
        .chain(PREAMBLE_SAMPLING)
    {
        assert!(preamble.contains_key(*k), "preamble: no {k}");
    }
    let header: Vec<&str> = lines[i].split(',').collect();
    assert_eq!(header, CSV_COLUMNS, "the column line");
    assert_eq!(
        lines.iter().filter(|l| **l == lines[i]).count(),
        1,
        "the column line once"
    );
    i += 1;
    let mut pre = Row::new();
    for k in ["n_ctx", "n_ubatch", "chatml", "moe_stream", "temp"] {
        pre.insert(k.to_owned(), preamble[k].parse().unwrap());
    }
    let mut turns = Vec::new();
    let mut rows = Vec::new();
    while i < lines.len() {
        let l = lines[i];
        i += 1;
        if let Some(s) = l.strip_prefix("# summary ") {
            let mut sum = Row::new();
            for p in s.split_whitespace() {
                let (k, v) = p.split_once('=').unwrap_or_else(|| panic!("summary: {p}"));
                let x = v.parse().unwrap_or_else(|_| panic!("summary {k}={v}"));
                sum.insert(k.to_owned(), x);
            }
            for k in SUMMARY_KEYS {
                assert!(sum.contains_key(*k), "summary: no {k}");
            }
            turns.push((std::mem::take(&mut rows), sum));
            continue;
        }
        assert!(
            !l.starts_with('#'),
            "only # summary lines after the rows: {l}"
        );
        let fields: Vec<&str> = l.split(',').collect();
        assert_eq!(fields.len(), header.len(), "{l}");
        let mut row = Row::new();
        for (name, f) in header.iter().zip(fields) {
            if CSV_INT_COLUMNS.contains(name) {
                f.parse::<i64>()
                    .unwrap_or_else(|_| panic!("{name}: {f} is not an integer"));
            }
            row.insert(
                (*name).to_owned(),
                f.parse().unwrap_or_else(|_| panic!("{name}: {f}")),
            );
        }
        rows.push(row);
    }
    assert!(rows.is_empty(), "rows after the last summary");
    (pre, turns)
}

/// `--csv` across the turns of a session: the preamble once, one row per generated token with
/// the turn's number and its own steps, and one `# summary` line after each turn.
#[test]
fn the_csv_spans_the_turns() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_chat(dir.path());
    let csv = dir.path().join("s.csv");
    let mut s = Session::start(
        &m,
        &with(
            CHAT,
            &["-n", "4", "--ubatch", "8", "--csv", csv.to_str().unwrap()],
        ),
    );
    let reqs = [
        json!({"cmd": "generate", "id": 1, "prompt": "Hello"}),
        json!({"cmd": "generate", "id": 2, "prompt": "More please.", "n_predict": 6,
            "clear_kv": false}),
        json!({"cmd": "generate", "id": 3, "prompt": "Something else.", "n_predict": 5}),
    ];
    let turns: Vec<Turn> = reqs.iter().map(|r| s.generate(r)).collect();
    s.close(true);
    let (pre, csv_turns) = parse_session_csv(&std::fs::read_to_string(&csv).unwrap());
    assert_eq!(pre["chatml"], 1.0);
    assert_eq!(pre["n_ubatch"], 8.0);
    assert_eq!(pre["temp"], 0.0);
    assert_eq!(csv_turns.len(), turns.len(), "a summary per turn");
    for (k, ((rows, sum), t)) in csv_turns.iter().zip(&turns).enumerate() {
        let n = t.num("tokens");
        assert_eq!(rows.len() as u64, n, "turn {k}");
        assert_eq!(sum["tokens"], n as f64, "turn {k}");
        for (j, r) in rows.iter().enumerate() {
            assert_eq!(r["turn"], k as f64);
            assert_eq!(r["step"], j as f64 + 1.0);
            assert_eq!(r["steps"], n as f64);
            assert_eq!(r["mtp_batch"], 1.0);
            assert_eq!(r["read_bytes"], 0.0, "resident");
        }
        assert_eq!(t.progress.len() as u64, n);
    }
}

/// A template that reads `enable_thinking` (as Qwen3's does: reasoning off opens the turn with
/// an empty `<think></think>`): the session reports `think_ctl` `template`, and each request's
/// `think` decides its prompt — the one `tokenize --chatml` renders with or without
/// `--no-think` — whatever the process's `--no-think` says.
#[test]
fn each_request_thinks_as_it_asks() {
    let dir = tempfile::tempdir().unwrap();
    let tmpl = "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
                {%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n\
                {%- if enable_thinking is defined and enable_thinking is false -%}\
                <think>\n\n</think>\n\n{%- endif -%}{%- endif -%}";
    let m = demo_with_template(dir.path(), tmpl, "demo-think.gguf");
    let mp = m.to_str().unwrap();
    let on = token_ids(&["-m", mp, "--chatml", "Hi"]).len() as u64;
    let off = token_ids(&["-m", mp, "--chatml", "--no-think", "Hi"]).len() as u64;
    assert!(off > on, "{off} vs {on}");
    for process in [&[][..], &["--no-think"][..]] {
        let mut s = Session::start(&m, &with(&with(CHAT, &["-n", "2"]), process));
        assert_eq!(s.ready["think_ctl"], "template");
        for (think, want) in [(false, off), (true, on)] {
            let t = s.generate(&json!({"cmd": "generate", "id": 1, "prompt": "Hi",
                "think": think}));
            assert_eq!(t.num("n_prompt"), want, "think {think}: {}", t.done);
        }
        // Without the key, the process's flag decides.
        let t = s.generate(&gen_req(2, "Hi"));
        let want = if process.is_empty() { on } else { off };
        assert_eq!(t.num("n_prompt"), want, "{}", t.done);
        s.close(false);
    }
}

/// gpt-oss's own template (the harmony format, llama.cpp's copy of it in the gpt-oss fixture)
/// has no switch for reasoning: the session reports `think_ctl` `prefill`, and a request with
/// `think: false` gets the prompt `tokenize --chatml --no-think` renders — the analysis channel
/// opened and closed, the final channel opened — while `think: true` gets the plain one.
#[test]
fn gpt_oss_skips_reasoning_by_prefilling_the_harmony_channels() {
    let m = testdata::fixtures_root().join("moe/gptoss-mxfp4.gguf");
    let mp = m.to_str().unwrap();
    let on = token_ids(&["-m", mp, "--chatml", "Hi"]);
    let off = token_ids(&["-m", mp, "--chatml", "--no-think", "Hi"]);
    // the prefill is appended, in harmony tokens: <|channel|> (1030), <|message|> (1029),
    // <|end|> (1028), <|start|> (1027)
    assert_eq!(off[..on.len()], on[..]);
    for special in [1027, 1028, 1029, 1030] {
        assert!(off[on.len()..].contains(&special), "{off:?}");
    }
    let mut s = Session::start(&m, &with(CHAT, &["-n", "2"]));
    assert_eq!(s.ready["think_ctl"], "prefill");
    assert_eq!(s.ready["arch"], "gpt-oss");
    for (think, want) in [(false, off.len()), (true, on.len())] {
        let t = s.generate(&json!({"cmd": "generate", "id": 1, "prompt": "Hi", "think": think}));
        assert_eq!(t.num("n_prompt"), want as u64, "think {think}: {}", t.done);
    }
    s.close(false);
}

/// A session with `--ngram` answers each turn of a conversation as one without it, and its
/// `BMOE_DONE` counts what speculation did: every token either had a pass of its own or was a
/// kept draft, and only passes that drafted are drafted steps.
#[test]
fn ngram_speculation_in_a_session_answers_as_without_it_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_chat(dir.path());
    let args = with(CHAT, &["-n", "24"]);
    let mut plain = Session::start(&m, &args);
    let mut spec = Session::start(
        &m,
        &with(
            &args,
            &["--ngram", "--draft", "4", "--ngram-min-match", "1"],
        ),
    );
    let mut drafted = 0;
    for (k, prompt) in ["Say it again and again.", "Once more, again."]
        .iter()
        .enumerate()
    {
        let mut req = gen_req(k as i64 + 1, prompt);
        if k > 0 {
            req["clear_kv"] = json!(false);
        }
        let want = plain.generate(&req);
        let got = spec.generate(&req);
        assert_eq!(got.text(), want.text(), "turn {k}");
        assert_eq!(got.num("n_past"), want.num("n_past"), "turn {k}");
        assert_eq!(want.num("mtp_decodes"), 0);
        let tokens = got.num("tokens");
        assert_eq!(tokens, 24);
        assert_eq!(
            got.num("mtp_decodes") + got.num("mtp_accepted"),
            tokens,
            "turn {k}: {}",
            got.done
        );
        assert!(got.num("mtp_accepted") <= got.num("mtp_drafted"));
        assert!(got.num("drafted_steps") <= got.num("mtp_decodes"));
        assert_eq!(got.progress.len(), want.progress.len(), "turn {k}");
        drafted += got.num("drafted_steps");
    }
    assert!(drafted > 0, "nothing was drafted");
    plain.close(false);
    spec.close(false);
}

/// `--mtp` in a session: a conversation continued turn after turn answers as without it (the
/// head catches up on each turn's prompt), and `BMOE_DONE` counts a verify pass per token (the
/// fixture's head has random weights, so its drafts are rejected), every pass drafting but
/// the last.
#[test]
fn mtp_speculation_in_a_session_answers_as_without_it() {
    let m = testdata::fixtures_root().join("moe/glm4moe-q4_k_m.gguf");
    let args = with(CHAT, &["-n", "12"]);
    let mut plain = Session::start(&m, &args);
    let mut spec = Session::start(&m, &with(&args, &["--mtp", "--draft", "2"]));
    for (k, prompt) in ["Say it again and again.", "Once more, again.", "And again."]
        .iter()
        .enumerate()
    {
        let mut req = gen_req(k as i64 + 1, prompt);
        if k > 0 {
            req["clear_kv"] = json!(false);
        }
        let want = plain.generate(&req);
        let got = spec.generate(&req);
        assert_eq!(got.text(), want.text(), "turn {k}");
        assert_eq!(got.num("n_past"), want.num("n_past"), "turn {k}");
        let tokens = got.num("tokens");
        assert_eq!(tokens, want.num("tokens"), "turn {k}");
        assert_eq!(
            got.num("mtp_decodes") + got.num("mtp_accepted"),
            tokens,
            "turn {k}: {}",
            got.done
        );
        assert!(got.num("mtp_drafted") > 0, "turn {k}: {}", got.done);
        // every pass drafts but the last, which has no room left under -n
        assert_eq!(
            got.num("drafted_steps") + 1,
            got.num("mtp_decodes"),
            "turn {k}: {}",
            got.done
        );
    }
    plain.close(false);
    spec.close(false);
}
