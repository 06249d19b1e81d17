//! The server as a library, on a generated MoE test model and a loopback port: requests while
//! the model loads are answered 503, a completion is the runtime's own greedy text with its
//! token counts, a prompt that does not fit the context is told apart as
//! `context_length_exceeded`, a chat on a model without a template is refused before it is
//! queued, and `stop` ends the engine loop. No binary, no text scraped from a terminal.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use runtime::Notices;
use runtime::generate::Runtime;
use runtime::open::{Loaded, RunConfig, Sampling};
use runtime::session::{Session, SessionConfig};
use runtime::sink::Collect;
use serde_json::{Value, json};
use serve::http::Limits;
use serve::{Config, Server};

/// A model of `scripts/fetch_moe_fixtures.sh`.
fn moe(name: &str) -> PathBuf {
    let p = testdata::fixtures_root().join("moe").join(name);
    assert!(
        p.is_file(),
        "{} missing: run `bash scripts/fetch_moe_fixtures.sh`",
        p.display()
    );
    p
}

/// Greedy, two threads, no usage history (the tests must not write next to the fixtures).
fn config(model: &str) -> RunConfig {
    let mut cfg = RunConfig::new(moe(model));
    cfg.threads = Some(2);
    cfg.sampling = Sampling {
        temp: 0.0,
        seed: 1,
        ..Sampling::default()
    };
    cfg.history.no_usage = true;
    cfg
}

/// A server bound on a free loopback port and accepting connections (the engine not yet
/// running).
fn bound() -> Server {
    let server = Server::bind(Config {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        api_key: None,
        queue: 4,
        limits: Limits::default(),
        max_connections: 8,
        model_name: "fixture".into(),
    })
    .expect("bind a loopback port");
    server.start().expect("accept thread");
    server
}

/// One request on its own connection: the status and the body as JSON.
fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("send head");
    s.write_all(body.as_bytes()).expect("send body");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the answer");
    let text = String::from_utf8(raw).expect("utf-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    let body = serde_json::from_str(body).unwrap_or(Value::Null);
    (status, body)
}

/// Runs `f` with the engine loop of `server` over `rt` on another thread; stops the server and
/// waits for the loop to end before returning.
fn serving<T>(server: &Server, rt: &mut Runtime<'_>, f: impl FnOnce(SocketAddr) -> T) -> T {
    let addr = server.local_addr();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        let engine = scope.spawn(|| {
            server.serve(
                rt,
                SessionConfig {
                    n_predict: 8,
                    ..SessionConfig::default()
                },
                json!({"model": "fixture"}),
                move || {
                    let _ = ready_tx.send(());
                },
            );
        });
        ready_rx.recv().expect("the engine loop got ready");
        let out = f(addr);
        server.stop();
        engine
            .join()
            .expect("the engine loop ended without a panic");
        out
    })
}

/// The greedy text a fresh session of the runtime gives `prompt`, and its token counts.
fn own_answer(cfg: &RunConfig, prompt: &str, n: i64) -> (String, usize, usize) {
    let loaded = Loaded::open(cfg, &Notices::silent()).expect("open");
    let (mut rt, _) = loaded.runtime(cfg).expect("runtime");
    let mut session = Session::new(SessionConfig::default());
    let accepted = session
        .accept_text(&rt, prompt, Some(n), false)
        .expect("accepted");
    let n_prompt = accepted.prompt_tokens().len();
    let mut sink = Collect::default();
    let o = session.chat(&mut rt, accepted, &mut sink).expect("chat");
    assert_eq!(sink.answer, o.answer);
    (o.answer, n_prompt, o.tokens.len())
}

#[test]
fn requests_while_loading_are_answered_503_and_health_says_loading() {
    let server = bound();
    let addr = server.local_addr();
    let (status, body) = request(addr, "GET", "/health", None);
    assert_eq!(status, 503);
    assert_eq!(body["status"], "loading");
    let (status, body) = request(
        addr,
        "POST",
        "/v1/completions",
        Some(&json!({"prompt": "hello", "max_tokens": 2})),
    );
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], "loading");
    let (status, _) = request(addr, "GET", "/no/such/thing", None);
    assert_eq!(status, 404);
}

#[test]
fn a_completion_is_the_runtime_s_own_greedy_text_with_its_counts() {
    let cfg = config("qwen3moe-q4_k_m.gguf");
    let prompt = "The experts of a mixture";
    let (want, n_prompt, n_gen) = own_answer(&cfg, prompt, 6);
    assert!(n_gen > 0, "the reference generated nothing");

    let loaded = Loaded::open(&cfg, &Notices::silent()).expect("open");
    let (mut rt, _) = loaded.runtime(&cfg).expect("runtime");
    let server = bound();
    let (health, models, answer, again) = serving(&server, &mut rt, |addr| {
        let body = json!({"prompt": prompt, "max_tokens": 6, "temperature": 0});
        (
            request(addr, "GET", "/health", None),
            request(addr, "GET", "/v1/models", None),
            request(addr, "POST", "/v1/completions", Some(&body)),
            request(addr, "POST", "/v1/completions", Some(&body)),
        )
    });
    assert_eq!(health, (200, json!({"status": "ok"})));
    assert_eq!(models.0, 200);
    assert_eq!(models.1["data"][0]["id"], "fixture");
    let (status, body) = answer;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["text"], want.as_str());
    assert_eq!(body["usage"]["prompt_tokens"], n_prompt);
    assert_eq!(body["usage"]["completion_tokens"], n_gen);
    // The same request again (the context reused or not) gives the same text.
    assert_eq!(again.0, 200);
    assert_eq!(again.1["choices"][0]["text"], want.as_str());
    assert_eq!(server.running_max(), 1);
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_as_context_length_exceeded() {
    let mut cfg = config("qwen3moe-q4_k_m.gguf");
    cfg.ctx = Some(32);
    let loaded = Loaded::open(&cfg, &Notices::silent()).expect("open");
    let (mut rt, _) = loaded.runtime(&cfg).expect("runtime");
    let server = bound();
    let long = "the experts of a mixture route every token ".repeat(20);
    let (refused, fine) = serving(&server, &mut rt, |addr| {
        (
            request(
                addr,
                "POST",
                "/v1/completions",
                Some(&json!({"prompt": long, "max_tokens": 4})),
            ),
            request(
                addr,
                "POST",
                "/v1/completions",
                Some(&json!({"prompt": "short", "max_tokens": 2})),
            ),
        )
    });
    assert_eq!(refused.0, 400, "{}", refused.1);
    assert_eq!(refused.1["error"]["code"], "context_length_exceeded");
    // The refusal changed nothing: the next request runs.
    assert_eq!(fine.0, 200, "{}", fine.1);
    assert_eq!(fine.1["usage"]["completion_tokens"], 2);
}

#[test]
fn a_chat_on_a_model_without_a_template_is_refused_before_the_queue() {
    let cfg = config("mixtral-q8_0.gguf");
    let loaded = Loaded::open(&cfg, &Notices::silent()).expect("open");
    let (mut rt, _) = loaded.runtime(&cfg).expect("runtime");
    assert!(
        rt.format.is_none(),
        "the fixture was expected to have no chat template"
    );
    let server = bound();
    let (status, body) = serving(&server, &mut rt, |addr| {
        request(
            addr,
            "POST",
            "/v1/chat/completions",
            Some(&json!({"messages": [{"role": "user", "content": "hi"}]})),
        )
    });
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no chat template")),
        "{body}"
    );
    // It never reached the engine.
    assert_eq!(server.running_max(), 0);
}
