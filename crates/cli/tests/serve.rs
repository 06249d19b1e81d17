//! `sluice serve` end to end, on the MoEfied SmolLM2-135M (16 experts, top 12; its real chat
//! template; experts streamed): OpenAI's official Python client against it (streamed and
//! whole answers equal to `sluice run`'s, a multi-turn chat re-using the context, errors), the
//! safety defaults over raw HTTP, a cancelled waiting request that never runs, and a bounded
//! load with clients that leave mid-stream.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

fn model() -> PathBuf {
    let p = testdata::fixtures_root()
        .join("models")
        .join("SmolLM2-135M-Instruct-moefied-16x12.gguf");
    assert!(
        p.is_file(),
        "{} missing: run `bash scripts/make_moefied_models.sh`",
        p.display()
    );
    p
}

/// A running `sluice serve` on a free loopback port, killed on drop.
struct Serve {
    child: Child,
    addr: SocketAddr,
    /// Standard error's lines after the ready line.
    _log: Receiver<String>,
}

impl Serve {
    /// Starts `sluice serve -m <model> --port 0 --no-usage <extra>` and waits for its
    /// `ready` line.
    fn start(extra: &[&str]) -> Serve {
        let m = model();
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([
                "serve",
                "-m",
                m.to_str().expect("utf-8 path"),
                "--port",
                "0",
            ])
            .args(["--no-usage", "-t", "2", "--moe-stream", "on"])
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start sluice serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut addr = None;
        let mut seen = Vec::new();
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("sluice serve did not get ready: {seen:#?}"));
            if let Some(rest) = line.strip_prefix("sluice serve: listening on http://") {
                let a = rest.split_whitespace().next().expect("address");
                addr = Some(a.parse::<SocketAddr>().expect("socket address"));
            }
            if line.starts_with("sluice serve: ready") {
                break;
            }
            seen.push(line);
        }
        Serve {
            child,
            addr: addr.expect("a listening line before the ready line"),
            _log: rx,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The process's resident memory in KiB.
    fn rss_kib(&self) -> u64 {
        let s =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmRSS")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response: status, head, body.
struct Response {
    status: u16,
    head: String,
    body: String,
}

impl Response {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// Sends `raw` (a whole request; the server closes after it) and reads the whole response.
fn send(addr: SocketAddr, raw: &[u8]) -> Response {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(raw).expect("send");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    Response {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

/// A request with `headers` (each `Name: value`) and `body`, `Connection: close`.
fn request(addr: SocketAddr, method: &str, path: &str, headers: &[&str], body: &str) -> Response {
    let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for h in headers {
        raw.push_str(h);
        raw.push_str("\r\n");
    }
    if !body.is_empty() {
        raw.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    raw.push_str("\r\n");
    raw.push_str(body);
    send(addr, raw.as_bytes())
}

fn post(addr: SocketAddr, path: &str, headers: &[&str], body: &Value) -> Response {
    request(addr, "POST", path, headers, &body.to_string())
}

/// `sluice run`'s answer to one user message, greedy, `n` tokens.
fn run_answer(prompt: &str, n: usize) -> String {
    let m = model();
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "run",
            "-m",
            m.to_str().expect("utf-8 path"),
            "--chatml",
            "-p",
            prompt,
        ])
        .args([
            "-n",
            &n.to_string(),
            "--temp",
            "0",
            "--progress",
            "--no-usage",
        ])
        .args(["-t", "2", "--moe-stream", "on"])
        .output()
        .expect("run sluice");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (_, rest) = out.split_once("=== answer ===\n").expect("answer block");
    let (answer, _) = rest.split_once("\n=== perf ===").expect("perf block");
    answer.to_owned()
}

/// The Python that has OpenAI's client (scripts/fetch_serve_deps.sh).
fn client_python() -> PathBuf {
    let p = testdata::fixtures_root()
        .join("venv-serve")
        .join("bin")
        .join("python3");
    assert!(
        p.is_file(),
        "{} missing: run `bash scripts/fetch_serve_deps.sh`",
        p.display()
    );
    p
}

#[test]
fn n_expert_used_is_applied_and_reported_as_lossy() {
    let s = Serve::start(&["--n-expert-used", "9"]);
    let info = &telemetry(s.addr)["info"];
    assert_eq!(info["n_expert_used"], 9, "{info}");
    let mode = info["mode"].as_str().expect("mode");
    assert!(
        mode.contains("9 experts per token (lossy: --n-expert-used, the model routes 12)"),
        "{mode}"
    );
}

#[test]
fn the_official_openai_client_chats_streams_and_gets_errors() {
    let prompt = "What is the capital of France?";
    let n = 16;
    let s = Serve::start(&["--api-key", "test-key"]);
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/serve_openai_check.py");
    let o = Command::new(client_python())
        .arg(script)
        .args([&s.url(), "test-key", prompt, &n.to_string()])
        .output()
        .expect("run the client");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).expect("the client's report");
    assert_eq!(r["models"], json!(["SmolLM2-135M-Instruct-moefied-16x12"]));
    let answer = run_answer(prompt, n);
    assert!(!answer.is_empty());
    // Greedy: the whole answer, the streamed one and `sluice run`'s are the same text.
    assert_eq!(r["chat"], json!(answer), "{r:#}");
    assert_eq!(r["stream"], json!(answer), "{r:#}");
    assert_eq!(r["chat_finish"], "length");
    assert_eq!(r["stream_finish"], "length");
    let usage = &r["chat_usage"];
    assert_eq!(usage[1], json!(n));
    assert_eq!(r["stream_usage"], json!([usage[0], usage[1]]));
    assert_eq!(r["stream_roles"], json!(["assistant"]));
    // The second turn re-uses the context: fewer new tokens than the prompt holds.
    let (total, new) = (
        r["multi_prompt"][0].as_u64().expect("prompt tokens"),
        r["multi_prompt"][1].as_u64().expect("new tokens"),
    );
    assert!(
        new > 0 && new < total && total > usage[0].as_u64().unwrap_or(0),
        "{r:#}"
    );
    assert!(!r["multi"].as_str().unwrap_or("").is_empty());
    // A stop sequence ends the text before it.
    assert!(
        !r["completion"].as_str().unwrap_or("\n").contains('\n'),
        "{r:#}"
    );
    assert_eq!(r["bad"][0], 400);
    assert_eq!(r["overflow"], json!([400, "context_length_exceeded"]));
    assert_eq!(r["wrong_key"], json!([401, "invalid_api_key"]));
}

#[test]
fn safety_defaults_refuse_foreign_hosts_origins_keys_and_big_bodies() {
    let s = Serve::start(&["--api-key", "k1", "--max-body-kb", "1"]);
    let a = s.addr;
    let chat = json!({"messages":[{"role":"user","content":"hi"}],"max_tokens":2});
    let key = "Authorization: Bearer k1";
    // DNS rebinding: a loopback server answers only loopback names.
    let r = send(
        a,
        b"GET /health HTTP/1.1\r\nHost: evil.example:8080\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let r = send(a, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert_eq!(r.status, 403, "no Host: {}", r.body);
    let r = send(
        a,
        b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // A foreign browser origin may not change state, even with the key.
    let r = post(
        a,
        "/v1/chat/completions",
        &[key, "Origin: http://evil.example"],
        &chat,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "permission_error");
    let own = format!("Origin: http://{a}");
    let r = post(a, "/v1/chat/completions", &[key, &own], &chat);
    assert_eq!(r.status, 200, "{}", r.body);
    // The key.
    let r = post(a, "/v1/chat/completions", &[], &chat);
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(r.head.contains("WWW-Authenticate: Bearer"));
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = request(a, "GET", "/v1/models", &["Authorization: Bearer k2"], "");
    assert_eq!(r.status, 401);
    let r = request(a, "GET", "/v1/models", &[key], "");
    assert_eq!(r.status, 200);
    // Sizes: a body over --max-body-kb, a head over 16 KiB.
    let big = json!({"messages":[{"role":"user","content":"x".repeat(2000)}]});
    let r = post(a, "/v1/chat/completions", &[key], &big);
    assert_eq!(r.status, 413, "{}", r.body);
    let long = format!("X-Long: {}", "a".repeat(20000));
    let r = request(a, "GET", "/health", &[&long], "");
    assert_eq!(r.status, 431);
    // Paths, methods, bodies.
    assert_eq!(request(a, "GET", "/nope", &[key], "").status, 404);
    assert_eq!(
        request(a, "GET", "/v1/chat/completions", &[key], "").status,
        405
    );
    let r = request(a, "POST", "/v1/chat/completions", &[key], "{\"messages\":");
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("JSON")
    );
    // The page is served without the key, with a policy that keeps it to its own origin.
    let r = request(a, "GET", "/", &[], "");
    assert_eq!(r.status, 200);
    assert!(
        r.head
            .contains("Content-Security-Policy: default-src 'self'")
    );
    assert!(r.body.contains("<html"));
}

/// Opens a streamed completion of `max_tokens` (`ignore_eos`) and returns the socket once the
/// response head arrived (the request is running or waiting).
fn open_stream(addr: SocketAddr, max_tokens: usize) -> BufReader<TcpStream> {
    let body = json!({"prompt":"Count: one, two,","max_tokens":max_tokens,"stream":true,
                      "temperature":0,"ignore_eos":true});
    post_open(addr, &body)
}

/// Sends a completion request and returns the open connection, unread.
fn post_open(addr: SocketAddr, body: &Value) -> BufReader<TcpStream> {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    BufReader::new(s)
}

/// Reads the events of a streamed response up to `n` data chunks (or its end); the texts.
fn read_chunks(r: &mut BufReader<TcpStream>, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    let mut line = String::new();
    while got.len() < n {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => panic!("reading the stream: {e}"),
        }
        if line.starts_with("HTTP/1.1 ") {
            assert!(line.contains(" 200 "), "{line}");
        }
        if let Some(d) = line.trim_end().strip_prefix("data: ") {
            if d == "[DONE]" {
                break;
            }
            got.push(d.to_owned());
        }
    }
    got
}

fn telemetry(addr: SocketAddr) -> Value {
    request(addr, "GET", "/v1/telemetry", &[], "").json()
}

/// Waits until `f` holds for the telemetry (each look is a request: the server's own
/// state, no sleep).
fn until(addr: SocketAddr, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..100_000 {
        let t = telemetry(addr);
        if f(&t) {
            return t;
        }
    }
    panic!("the server never got to: {what}");
}

#[test]
fn a_client_that_leaves_cancels_its_request_and_a_waiting_one_never_runs() {
    let s = Serve::start(&["--queue", "1"]);
    let a = s.addr;
    // A long generation runs; a second waits behind it; a third finds the queue full.
    let mut first = open_stream(a, 3000);
    assert_eq!(read_chunks(&mut first, 2).len(), 2);
    let second = open_stream(a, 50);
    until(a, "the second request waits", |t| {
        t["requests"]["queued"] == 1
    });
    let r = post(
        a,
        "/v1/completions",
        &[],
        &json!({"prompt":"x","max_tokens":1}),
    );
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "queue_full");
    // The waiting client leaves: its request is taken out before it ran.
    drop(second);
    until(a, "the waiting request is dropped", |t| {
        t["requests"]["queued"] == 0 && t["requests"]["cancelled"] == 1
    });
    // The running client leaves: its generation stops long before its 3000 tokens.
    let read = read_chunks(&mut first, 3).len() + 2;
    drop(first);
    let t = until(a, "the running request is cancelled", |t| {
        t["requests"]["cancelled"] == 2 && t["requests"]["running"] == 0
    });
    let steps: Vec<u64> = t["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter(|r| r["seq"] == 1)
        .filter_map(|r| r["step"].as_u64())
        .collect();
    assert!(!steps.is_empty());
    let last = steps.iter().max().copied().unwrap_or(0);
    assert!(last < 3000, "ran {last} steps after reading {read}");
    // The second request never ran: no token of it.
    assert!(
        t["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .all(|r| r["seq"] != 2),
        "{t:#}"
    );
    // The engine is free: the next request is answered.
    let r = post(
        a,
        "/v1/completions",
        &[],
        &json!({"prompt":"x","max_tokens":2,"temperature":0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(t["requests"]["running_max"], 1);
}

/// One load-test client's request: a prompt (by index), whether it streams, whether it
/// leaves mid-stream.
#[derive(Clone, Copy)]
struct Ask {
    prompt: usize,
    stream: bool,
    leave: bool,
}

/// What became of a request.
#[derive(Debug, PartialEq)]
enum Got {
    /// Answered: the text and the prompt tokens.
    Text(String, u64),
    Refused,
    Left,
}

const PROMPTS: [&str; 8] = [
    "The river",
    "A mixture of experts",
    "Once upon a time in a small village",
    "The capital of Italy is",
    "def fibonacci(n):",
    "Water boils at",
    "My favourite colour",
    "In 1969, the first",
];

fn ask(addr: SocketAddr, a: Ask) -> Got {
    // Each prompt prefilled whole, so that its answer cannot depend on what ran before.
    let body = json!({"prompt": PROMPTS[a.prompt], "temperature": 0, "stream": a.stream,
        "stream_options": {"include_usage": a.stream}, "cache_prompt": false,
        "max_tokens": if a.leave { 400 } else { 4 }, "ignore_eos": true});
    if !a.stream {
        let r = post(addr, "/v1/completions", &[], &body);
        return match r.status {
            200 => {
                let v = r.json();
                Got::Text(
                    v["choices"][0]["text"].as_str().expect("text").to_owned(),
                    v["usage"]["prompt_tokens"].as_u64().expect("usage"),
                )
            }
            429 => Got::Refused,
            s => panic!("status {s}: {}", r.body),
        };
    }
    let mut r = post_open(addr, &body);
    let mut status = String::new();
    r.read_line(&mut status).expect("status line");
    if status.contains(" 429 ") {
        return Got::Refused;
    }
    assert!(status.contains(" 200 "), "{status}");
    if a.leave {
        assert_eq!(read_chunks(&mut r, 3).len(), 3);
        return Got::Left;
    }
    let mut text = String::new();
    let mut prompt_tokens = 0;
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        let Some(d) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if d == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(d).expect("chunk");
        if let Some(t) = v["choices"][0]["text"].as_str() {
            text.push_str(t);
        }
        if let Some(n) = v["usage"]["prompt_tokens"].as_u64() {
            prompt_tokens = n;
        }
    }
    Got::Text(text, prompt_tokens)
}

#[test]
fn a_bounded_load_is_answered_or_refused_never_lost_or_mixed() {
    let s = Serve::start(&["--queue", "12"]);
    let a = s.addr;
    // Each prompt's answer alone, first (greedy: any later answer must be the same).
    let reference: Vec<(String, u64)> = (0..PROMPTS.len())
        .map(|p| {
            match ask(
                a,
                Ask {
                    prompt: p,
                    stream: false,
                    leave: false,
                },
            ) {
                Got::Text(t, n) => (t, n),
                other => panic!("{other:?}"),
            }
        })
        .collect();
    let rss_before = s.rss_kib();
    let t0 = std::time::Instant::now();
    let clients = 16;
    let total = 200;
    let results: Vec<(Ask, Got)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                scope.spawn(move || {
                    (c..total)
                        .step_by(clients)
                        .map(|i| {
                            let q = Ask {
                                prompt: i % PROMPTS.len(),
                                stream: i % 2 == 1,
                                leave: i % 10 == 3,
                            };
                            (q, ask(a, q))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("client"))
            .collect()
    });
    assert_eq!(results.len(), total);
    let (mut answered, mut refused, mut left) = (0, 0, 0);
    for (q, got) in &results {
        match got {
            Got::Text(t, n) => {
                answered += 1;
                assert_eq!((t, n), (&reference[q.prompt].0, &reference[q.prompt].1));
            }
            Got::Refused => refused += 1,
            Got::Left => left += 1,
        }
    }
    let t = until(a, "every request ended", |t| {
        t["requests"]["running"] == 0 && t["requests"]["queued"] == 0
    });
    let req = &t["requests"];
    eprintln!(
        "load: {total} requests in {:.1} s: {answered} answered, {refused} refused (429), \
         {left} left mid-stream; server {req}; RSS {rss_before} -> {} KiB",
        t0.elapsed().as_secs_f64(),
        s.rss_kib()
    );
    assert!(answered > 0 && left > 0);
    assert_eq!(req["running_max"], 1, "two generations ran at once");
    assert_eq!(req["refused"], json!(refused));
    assert_eq!(req["served"], json!(answered + PROMPTS.len()));
    assert_eq!(req["cancelled"], json!(left));
    // Memory stays bounded: the connections' buffers and threads are given back.
    let rss_after = s.rss_kib();
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS grew from {rss_before} to {rss_after} KiB"
    );
}

#[test]
fn the_dashboard_streams_a_chat_and_draws_its_telemetry_in_chromium() {
    let node_dir = testdata::fixtures_root().join("node-serve");
    assert!(
        node_dir
            .join("node_modules")
            .join("playwright-core")
            .is_dir(),
        "{} missing: run `bash scripts/fetch_serve_deps.sh`",
        node_dir.display()
    );
    let chromium = ["/usr/bin/chromium", "/usr/lib/chromium/chromium"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .expect("Debian's chromium: run `bash scripts/fetch_serve_deps.sh`");
    // A cache smaller than the experts, so that the heatmap shows misses too.
    let s = Serve::start(&["--cache-mb", "40", "--force-cache"]);
    // The script resolves `playwright-core` from where it lies: run a copy next to it.
    let script = node_dir.join("serve_browser_check.mjs");
    std::fs::copy(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/serve_browser_check.mjs"),
        &script,
    )
    .expect("copy the browser script");
    let dir = tempfile::tempdir().expect("temp dir");
    // SLUICE_SCREENSHOT=PATH keeps the screenshot (docs/serve.md's picture is made so).
    let shot = std::env::var_os("SLUICE_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.path().join("dashboard.png"));
    let prompt = "What is the capital of France?";
    let o = Command::new("node")
        .arg(&script)
        .args([
            &s.url(),
            prompt,
            shot.to_str().expect("utf-8 path"),
            chromium,
        ])
        .output()
        .expect("run node");
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let r: Value = serde_json::from_slice(&o.stdout).expect("the browser's report");
    assert_eq!(r["console_errors"], json!([]), "{r:#}");
    assert_eq!(r["foreign_requests"], json!([]), "{r:#}");
    assert_eq!(r["model"], "SmolLM2-135M-Instruct-moefied-16x12");
    // The page's request was the server's first (prefilled whole): its answer is `sluice
    // run`'s, and it arrived in pieces.
    assert_eq!(r["answer"], json!(run_answer(prompt, 24)), "{r:#}");
    assert!(r["answer_lengths"].as_u64().unwrap_or(0) >= 3, "{r:#}");
    assert!(r["stats"]["bars"].as_u64().unwrap_or(0) > 0, "{r:#}");
    assert!(r["stats"]["heatCells"].as_u64().unwrap_or(0) > 0, "{r:#}");
    assert!(r["painted"][0].as_u64().unwrap_or(0) > 0 && r["painted"][1].as_u64().unwrap_or(0) > 0);
    assert!(
        r["toks"]
            .as_str()
            .is_some_and(|t| t.parse::<f64>().is_ok_and(|v| v > 0.0)),
        "{r:#}"
    );
    assert!(r["config_rows"].as_u64().unwrap_or(0) > 10, "{r:#}");
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 10_000));
}
