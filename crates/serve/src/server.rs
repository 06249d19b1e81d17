//! The server: a listener whose connections each get a thread (up to a limit), and the one
//! engine, run by the thread that calls [`Server::serve`] over the runtime's session, taking
//! generation requests from a bounded FIFO one at a time.
//!
//! A connection that asks for a generation queues it and then waits for its events, watching
//! its client meanwhile: a client that leaves takes its request out of the queue (it never
//! runs) or cancels it in flight (the engine stops before the next token).

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use runtime::cancel::Control;
use runtime::events::TokenRow;
use runtime::generate::Runtime;
use runtime::session::{Session, SessionConfig};
use runtime::sink::Sink;
use runtime::source::{StreamCounters, StreamSnapshot};

use crate::api::{self, ApiError, ChatParams, CompletionParams, Stamp, StopMatcher};
use crate::guard;
use crate::http::{self, Conn, Limits, Request};
use crate::hub::{self, Hub};

/// How often a waiting connection looks whether its client is still there.
const POLL: Duration = Duration::from_millis(20);

/// The dashboard page (static, in the binary).
const INDEX_HTML: &str = include_str!("../assets/index.html");

/// How the server is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen.
    pub addr: SocketAddr,
    /// Requests must carry `Authorization: Bearer <key>` (`/v1/...`).
    pub api_key: Option<String>,
    /// Generation requests waiting at most (the one running is not counted).
    pub queue: usize,
    pub limits: Limits,
    /// Connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// The model's name in `/v1/models` and the responses.
    pub model_name: String,
}

/// A generation request.
#[derive(Debug)]
enum Work {
    Chat(ChatParams),
    Completion(CompletionParams),
}

impl Work {
    fn common(&self) -> &api::Common {
        match self {
            Work::Chat(p) => &p.common,
            Work::Completion(p) => &p.common,
        }
    }
}

/// What the engine tells the connection that asked.
#[derive(Debug)]
enum Out {
    /// The request was accepted and its prompt is this many tokens.
    Started { prompt_tokens: usize },
    /// New text (with `reset`: the whole text so far, replacing what was sent).
    Text {
        content: String,
        reasoning: String,
        reset: bool,
    },
    /// The generation ended.
    Done {
        finish: &'static str,
        completion_tokens: usize,
        timings: Value,
    },
    /// Refused or failed.
    Error(ApiError),
}

type Queued = (Work, Sender<Out>);

/// What the engine thread and the connections share.
struct Shared {
    cfg: Config,
    queue: crate::queue::Queue<Queued>,
    hub: Arc<Hub>,
    control: Arc<Control>,
    /// Bound to a loopback address: only loopback Host names are answered.
    loopback: bool,
    /// The model renders chats with a template (set when ready).
    has_template: AtomicBool,
    connections: AtomicUsize,
    /// Generations running now (0 or 1: the engine runs one at a time).
    running: AtomicUsize,
    /// The most generations ever seen running at once.
    running_max: AtomicUsize,
}

/// A bound server; [`start`](Server::start) accepts connections, [`serve`](Server::serve)
/// runs the engine.
pub struct Server {
    shared: Arc<Shared>,
    listener: Mutex<Option<TcpListener>>,
    addr: SocketAddr,
}

impl Server {
    /// Binds `cfg.addr`.
    pub fn bind(cfg: Config) -> std::io::Result<Server> {
        let listener = TcpListener::bind(cfg.addr)?;
        let addr = listener.local_addr()?;
        Ok(Server {
            shared: Arc::new(Shared {
                loopback: addr.ip().is_loopback(),
                queue: crate::queue::Queue::new(cfg.queue.max(1)),
                cfg,
                hub: Arc::new(Hub::new()),
                control: Arc::new(Control::new(None, runtime::Notices::silent())),
                has_template: AtomicBool::new(false),
                connections: AtomicUsize::new(0),
                running: AtomicUsize::new(0),
                running_max: AtomicUsize::new(0),
            }),
            listener: Mutex::new(Some(listener)),
            addr,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The live telemetry (the load's progress goes here).
    pub fn hub(&self) -> &Arc<Hub> {
        &self.shared.hub
    }

    /// The most generations that ever ran at once (1 when the engine was used).
    pub fn running_max(&self) -> usize {
        self.shared.running_max.load(Ordering::SeqCst)
    }

    /// Accepts connections on a thread of its own, each served by a thread.
    pub fn start(&self) -> std::io::Result<()> {
        let Some(listener) = self
            .listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return Ok(());
        };
        let shared = Arc::clone(&self.shared);
        std::thread::Builder::new()
            .name("serve-accept".into())
            .spawn(move || accept_loop(&shared, &listener))?;
        Ok(())
    }

    /// No more generation requests: [`serve`](Server::serve) returns once the one running
    /// ends.
    pub fn stop(&self) {
        self.shared.queue.close();
    }

    /// Runs the engine: takes generation requests in order until [`stop`](Server::stop).
    /// `info` describes the model and its configuration (the dashboard shows it);
    /// `on_ready` is called once requests are answered. An engine failure answers its request
    /// 500 and starts the next one on a fresh context.
    pub fn serve(
        &self,
        rt: &mut Runtime<'_>,
        config: SessionConfig,
        info: Value,
        on_ready: impl FnOnce(),
    ) {
        let sh = &self.shared;
        rt.install_control(Arc::clone(&sh.control));
        sh.has_template.store(rt.format.is_some(), Ordering::SeqCst);
        sh.hub.ready(info);
        on_ready();
        let base = *rt.sampler.params();
        let mut session = Session::new(config.clone());
        while let Some(job) = sh.queue.pop() {
            let (work, tx) = job.work;
            sh.control.start(job.seq);
            if job.cancelled.load(Ordering::SeqCst) {
                // Its client left between the queue and here: it never runs.
                sh.control.done();
                sh.hub.cancelled();
                continue;
            }
            let now = sh.running.fetch_add(1, Ordering::SeqCst) + 1;
            sh.running_max.fetch_max(now, Ordering::SeqCst);
            let ran = run_job(
                sh,
                rt,
                &mut session,
                &base,
                JobRef {
                    work: &work,
                    tx: &tx,
                    seq: job.seq,
                    cancelled: &job.cancelled,
                },
            );
            sh.running.fetch_sub(1, Ordering::SeqCst);
            sh.control.done();
            if let Err(e) = ran {
                let _ = tx.send(Out::Error(ApiError::new(
                    500,
                    format!("the engine failed: {}", runtime::error::chain(&e)),
                )));
                rt.engine.reset();
                session = Session::new(config.clone());
            }
        }
    }
}

/// A queued request as the engine thread runs it: what to do, where its output goes, its
/// number, and its client's cancel flag.
struct JobRef<'j> {
    work: &'j Work,
    tx: &'j Sender<Out>,
    seq: u64,
    cancelled: &'j Arc<AtomicBool>,
}

/// One generation on the engine thread.
fn run_job(
    sh: &Shared,
    rt: &mut Runtime<'_>,
    session: &mut Session,
    base: &sampler::SamplerParams,
    job: JobRef<'_>,
) -> runtime::Result<()> {
    let JobRef {
        work,
        tx,
        seq,
        cancelled,
    } = job;
    let common = work.common();
    let accepted = match work {
        Work::Chat(p) => session.accept_messages(
            rt,
            &p.messages,
            common.max_tokens,
            p.think,
            common.cache_prompt,
        ),
        Work::Completion(p) => {
            session.accept_text(rt, &p.prompt, common.max_tokens, common.cache_prompt)
        }
    };
    let accepted = match accepted {
        Ok(a) => a,
        Err(runtime::Error::Rejected(r)) => {
            let _ = tx.send(Out::Error(api::refusal_error(&r)));
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    rt.sampler = sampler::Sampler::new(common.sampling.apply(base));
    rt.ignore_eos = common.ignore_eos;
    let prompt_tokens = accepted.prompt_tokens().len();
    let _ = tx.send(Out::Started { prompt_tokens });
    let mut sink = JobSink {
        tx: tx.clone(),
        stops: common.stop.clone(),
        stop: StopMatcher::new(common.stop.clone()),
        control: Arc::clone(&sh.control),
        seq,
        cancelled: Arc::clone(cancelled),
        hub: &sh.hub,
        counters: Arc::clone(&rt.counters),
        last: rt.counters.snapshot(),
        threads: rt.n_threads,
        overlap: rt.overlap,
        streaming: rt.streaming && rt.cache_bytes > 0,
    };
    let o = session.chat(rt, accepted, &mut sink)?;
    if let Some(h) = &rt.recorders.heat {
        sh.hub.heat(heat_json(&h.snapshot()));
    }
    if o.cancelled {
        sh.hub.cancelled();
        return Ok(());
    }
    let s = &o.summary;
    let tok_s = if s.decode_s > 0.0 {
        s.tokens as f64 / s.decode_s
    } else {
        0.0
    };
    let timings = json!({
        "seq": seq,
        "prompt_tokens": prompt_tokens,
        "prompt_new": s.n_prompt,
        "prefill_s": s.prefill_s,
        "tokens": s.tokens,
        "decode_s": s.decode_s,
        "tok_s": tok_s,
        "cache_hit_pct": s.cache_hit_pct,
        "read_mib": o.d.read_bytes as f64 / f64::from(1u32 << 20),
        "n_past": rt.engine.n_past(),
    });
    sh.hub.done(timings.clone());
    let finish = if sink.stop.stopped() {
        "stop"
    } else {
        api::finish_reason(o.end)
    };
    let _ = tx.send(Out::Done {
        finish,
        completion_tokens: s.tokens,
        timings,
    });
    Ok(())
}

/// The heatmap as JSON: counts rounded to 0.01, and what the last routing of each cell found.
fn heat_json(h: &runtime::routes::HeatSnapshot) -> Value {
    let counts: Vec<Value> = h
        .counts
        .iter()
        .map(|&c| json!((f64::from(c) * 100.0).round() / 100.0))
        .collect();
    json!({
        "n_layer": h.n_layer,
        "n_expert": h.n_expert,
        "rows": h.rows,
        "counts": counts,
        "found": h.found,
    })
}

/// Where a generation reports on the engine thread: its text to the connection (through the
/// stop sequences), its token figures to the hub.
struct JobSink<'h> {
    tx: Sender<Out>,
    stops: Vec<String>,
    stop: StopMatcher,
    control: Arc<Control>,
    seq: u64,
    cancelled: Arc<AtomicBool>,
    hub: &'h Hub,
    counters: Arc<StreamCounters>,
    last: StreamSnapshot,
    threads: usize,
    overlap: bool,
    streaming: bool,
}

impl JobSink<'_> {
    fn send(&self, out: Out) {
        if self.tx.send(out).is_err() {
            // The connection is gone: stop before the next token.
            self.control.cancel_one(self.seq, &self.cancelled);
        }
    }
}

impl Sink for JobSink<'_> {
    fn delta(&mut self, d: &chat::SplitDelta) -> runtime::Result<()> {
        if d.reset {
            self.stop = StopMatcher::new(self.stops.clone());
            let content = self.stop.push(&d.text);
            self.send(Out::Text {
                content,
                reasoning: d.reasoning.clone(),
                reset: true,
            });
            return Ok(());
        }
        let content = self.stop.push(&d.text);
        if !content.is_empty() || !d.reasoning.is_empty() {
            self.send(Out::Text {
                content,
                reasoning: d.reasoning.clone(),
                reset: false,
            });
        }
        Ok(())
    }

    fn token(&mut self, row: &TokenRow) -> runtime::Result<()> {
        let now = self.counters.snapshot();
        let d = now.since(&self.last);
        self.last = now;
        // The token's figures as the metrics CSV has them.
        let row = row.metrics();
        let [compute, flash, mgmt, rest] = hub::bars(
            row.wall_ms,
            row.cpu_ms,
            self.threads,
            row.io_ms,
            row.stall_ms,
            row.mgmt_ms,
            self.overlap,
        );
        let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
        self.hub.token(json!({
            "seq": self.seq,
            "step": row.step,
            "steps": row.steps,
            "wall_ms": r3(row.wall_ms),
            "compute_ms": r3(compute),
            "flash_ms": r3(flash),
            "mgmt_ms": r3(mgmt),
            "unattributed_ms": r3(rest),
            "io_ms": r3(row.io_ms),
            "stall_ms": r3(row.stall_ms),
            "cpu_ms": r3(row.cpu_ms),
            "read_mib": r3(row.read_bytes as f64 / f64::from(1u32 << 20)),
            "lookups": if self.streaming { d.lookups } else { 0 },
            "hits": if self.streaming { d.hits } else { 0 },
            "cache_hit_pct": r3(row.cache_hit_pct),
            "majflt": row.majflt,
            "rss_mib": r3(row.rss_mib),
        }));
        Ok(())
    }

    fn finished(&mut self, _o: &runtime::events::Outcome) -> runtime::Result<()> {
        let rest = self.stop.finish();
        if !rest.is_empty() {
            self.send(Out::Text {
                content: rest,
                reasoning: String::new(),
                reset: false,
            });
        }
        Ok(())
    }

    fn stop(&self) -> bool {
        self.stop.stopped()
    }
}

fn accept_loop(sh: &Arc<Shared>, listener: &TcpListener) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            continue;
        };
        let open = sh.connections.fetch_add(1, Ordering::SeqCst) + 1;
        if open > sh.cfg.max_connections {
            sh.connections.fetch_sub(1, Ordering::SeqCst);
            let e = ApiError::new(503, "too many connections");
            let mut s = stream;
            let _ = http::respond(&mut s, 503, JSON, &[], e.body().as_bytes(), false);
            continue;
        }
        let shared = Arc::clone(sh);
        let spawned = std::thread::Builder::new()
            .name("serve-conn".into())
            .spawn(move || {
                connection(&shared, stream);
                shared.connections.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            sh.connections.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

const JSON: &str = "application/json";

/// Serves one connection's requests until it closes.
fn connection(sh: &Shared, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut conn = Conn::new(stream);
    loop {
        let req = match conn.read_request(&sh.cfg.limits) {
            Ok(r) => r,
            Err(e) => {
                if let Some(status) = e.status() {
                    let body = ApiError::new(status, e.to_string()).body();
                    let _ =
                        http::respond(&mut conn.stream, status, JSON, &[], body.as_bytes(), false);
                    http::linger_close(&conn.stream);
                }
                return;
            }
        };
        let keep = route(sh, &mut conn, &req).unwrap_or(false);
        if !(keep && req.keep_alive) {
            return;
        }
    }
}

/// An error answer; the connection is kept when the request was read whole.
fn error(conn: &mut Conn, e: &ApiError, keep: bool) -> std::io::Result<bool> {
    let extra: &[(&str, &str)] = if e.status == 401 {
        &[("WWW-Authenticate", "Bearer")]
    } else {
        &[]
    };
    http::respond(
        &mut conn.stream,
        e.status,
        JSON,
        extra,
        e.body().as_bytes(),
        keep,
    )?;
    Ok(keep)
}

fn json_ok(conn: &mut Conn, v: &Value, keep: bool) -> std::io::Result<bool> {
    http::respond(
        &mut conn.stream,
        200,
        JSON,
        &[],
        v.to_string().as_bytes(),
        keep,
    )?;
    Ok(keep)
}

/// Answers one request; whether the connection may serve another.
fn route(sh: &Shared, conn: &mut Conn, req: &Request) -> std::io::Result<bool> {
    let keep = req.keep_alive;
    if sh.loopback && !req.header("host").is_some_and(guard::is_loopback_host) {
        let e = ApiError::new(
            403,
            "this server answers only loopback host names (localhost, 127.0.0.1, [::1])",
        );
        return error(conn, &e, false);
    }
    let path = req.path();
    let method = req.method.as_str();
    let known = [
        "/",
        "/index.html",
        "/health",
        "/v1/models",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/telemetry",
        "/v1/telemetry/events",
    ];
    if !known.contains(&path) {
        return error(
            conn,
            &ApiError::new(404, format!("no such endpoint: {path}")),
            keep,
        );
    }
    let post = matches!(path, "/v1/chat/completions" | "/v1/completions");
    if (post && method != "POST") || (!post && method != "GET") {
        let e = ApiError::new(405, format!("{method} is not allowed on {path}"));
        return error(conn, &e, keep);
    }
    if method != "GET"
        && !guard::origin_allowed(
            req.header("origin"),
            req.header("host"),
            req.header("sec-fetch-site"),
        )
    {
        let e = ApiError::new(403, "cross-origin requests that change state are refused");
        return error(conn, &e, false);
    }
    match path {
        "/" | "/index.html" => {
            let csp = "default-src 'self'; script-src 'self' 'unsafe-inline'; \
                       style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
                       connect-src 'self'; frame-ancestors 'none'";
            http::respond(
                &mut conn.stream,
                200,
                "text/html; charset=utf-8",
                &[("Content-Security-Policy", csp)],
                INDEX_HTML.as_bytes(),
                keep,
            )?;
            return Ok(keep);
        }
        "/health" => {
            let status = sh.hub.status();
            let ok = status["state"] == "ready";
            let body = if ok {
                json!({"status": "ok"})
            } else {
                json!({"status": status["state"], "progress": status["progress"],
                       "what": status["what"]})
            };
            http::respond(
                &mut conn.stream,
                if ok { 200 } else { 503 },
                JSON,
                &[],
                body.to_string().as_bytes(),
                keep,
            )?;
            return Ok(keep);
        }
        _ => {}
    }
    if let Some(key) = &sh.cfg.api_key {
        let given = guard::bearer(req.header("authorization")).unwrap_or("");
        if !guard::ct_eq(given.as_bytes(), key.as_bytes()) {
            let e = ApiError::new(
                401,
                "missing or wrong API key (Authorization: Bearer <key>)",
            );
            return error(conn, &e, keep);
        }
    }
    match path {
        "/v1/models" => json_ok(
            conn,
            &json!({"object": "list", "data": [{
                "id": sh.cfg.model_name, "object": "model", "created": unix_now(),
                "owned_by": "sluice"}]}),
            keep,
        ),
        "/v1/telemetry" => {
            let mut v = sh.hub.summary(sh.queue.len());
            v["requests"]["running"] = json!(sh.running.load(Ordering::SeqCst));
            v["requests"]["running_max"] = json!(sh.running_max.load(Ordering::SeqCst));
            json_ok(conn, &v, keep)
        }
        "/v1/telemetry/events" => {
            telemetry_events(sh, conn)?;
            Ok(false)
        }
        _ => generation(sh, conn, req, path == "/v1/chat/completions"),
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The telemetry event stream, until the client leaves.
fn telemetry_events(sh: &Shared, conn: &mut Conn) -> std::io::Result<()> {
    let rx = sh.hub.subscribe();
    http::start_events(&mut conn.stream)?;
    let mut last_ping = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(ev) => http::event(&mut conn.stream, Some(&ev.0), &ev.1)?,
            Err(RecvTimeoutError::Timeout) => {
                if !conn.peer_alive() {
                    return Ok(());
                }
                if last_ping.elapsed() >= Duration::from_secs(15) {
                    conn.stream.write_all(b": ping\n\n")?;
                    conn.stream.flush()?;
                    last_ping = Instant::now();
                }
            }
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        }
    }
}

/// A chat or text completion: queued, then answered whole or streamed.
fn generation(sh: &Shared, conn: &mut Conn, req: &Request, chat: bool) -> std::io::Result<bool> {
    let keep = req.keep_alive;
    if !sh.hub.is_ready() {
        let e = ApiError::new(503, "the model is still loading").with_code("loading");
        return error(conn, &e, keep);
    }
    let work = if chat {
        if !sh.has_template.load(Ordering::SeqCst) {
            let e = ApiError::bad(
                "the model has no chat template: use /v1/completions with a raw prompt",
            );
            return error(conn, &e, keep);
        }
        match api::parse_chat(&req.body) {
            Ok(p) => Work::Chat(p),
            Err(e) => return error(conn, &e, keep),
        }
    } else {
        match api::parse_completion(&req.body) {
            Ok(p) => Work::Completion(p),
            Err(e) => return error(conn, &e, keep),
        }
    };
    let stream = work.common().stream;
    let include_usage = work.common().include_usage;
    let (tx, rx) = channel();
    let Ok((seq, cancelled)) = sh.queue.push((work, tx)) else {
        sh.hub.refused();
        let e = ApiError::new(429, "the request queue is full; try again later");
        return error(conn, &e, keep);
    };
    let stamp = Stamp {
        id: format!("{}-{seq}", if chat { "chatcmpl" } else { "cmpl" }),
        created: unix_now(),
        model: sh.cfg.model_name.clone(),
        chat,
    };
    let leave = |sh: &Shared| {
        if sh.queue.remove(seq) {
            cancelled.store(true, Ordering::SeqCst);
            sh.hub.cancelled();
        } else {
            sh.control.cancel_one(seq, &cancelled);
        }
    };
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut prompt_tokens = 0usize;
    let mut started = false;
    loop {
        let ev = match rx.recv_timeout(POLL) {
            Ok(ev) => ev,
            Err(RecvTimeoutError::Timeout) => {
                if !conn.peer_alive() {
                    leave(sh);
                    return Ok(false);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                // The engine dropped the request without an answer (it was cancelled).
                if !started {
                    let e = ApiError::new(500, "the request ended without an answer");
                    return error(conn, &e, false);
                }
                return Ok(false);
            }
        };
        let sent = match ev {
            Out::Error(e) => {
                if started && stream {
                    let _ = http::event(&mut conn.stream, None, &e.body());
                    return Ok(false);
                }
                return error(conn, &e, keep);
            }
            Out::Started { prompt_tokens: n } => {
                prompt_tokens = n;
                started = true;
                if stream {
                    http::start_events(&mut conn.stream).and_then(|()| {
                        http::event(&mut conn.stream, None, &stamp.chunk("", "", true, false))
                    })
                } else {
                    Ok(())
                }
            }
            Out::Text {
                content: c,
                reasoning: r,
                reset,
            } => {
                if reset {
                    content = c.clone();
                    reasoning = r.clone();
                } else {
                    content.push_str(&c);
                    reasoning.push_str(&r);
                }
                if stream {
                    let chunk = if reset {
                        stamp.chunk(&content, &reasoning, false, true)
                    } else {
                        stamp.chunk(&c, &r, false, false)
                    };
                    http::event(&mut conn.stream, None, &chunk)
                } else {
                    Ok(())
                }
            }
            Out::Done {
                finish,
                completion_tokens,
                timings,
            } => {
                let usage = api::usage(prompt_tokens, completion_tokens);
                if stream {
                    let mut w = |s: &str| http::event(&mut conn.stream, None, s);
                    w(&stamp.last_chunk(finish))?;
                    if include_usage {
                        w(&stamp.usage_chunk(usage))?;
                    }
                    w("[DONE]")?;
                    return Ok(false);
                }
                let body = stamp.response(&content, &reasoning, finish, usage, timings);
                http::respond(&mut conn.stream, 200, JSON, &[], body.as_bytes(), keep)?;
                return Ok(keep);
            }
        };
        if sent.is_err() {
            leave(sh);
            return Ok(false);
        }
    }
}
