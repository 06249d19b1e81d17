//! The server's live telemetry: the state (loading with its progress, ready, failed), the model
//! and its resolved configuration, each generated token's time split and reads, each
//! generation's summary and the routing heatmap — kept for `GET /v1/telemetry` and sent as
//! events to every `GET /v1/telemetry/events` subscriber.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, Value, json};
use telemetry::bmoe_metrics::Preamble;

/// Token records kept for the summary (the page's window is at most this long).
pub const RECENT: usize = 512;

/// Events a slow subscriber may fall behind before it is dropped (its page reconnects).
const BACKLOG: usize = 4096;

/// One event: its name and JSON data.
pub type Event = Arc<(String, String)>;

#[derive(Default)]
struct State {
    subscribers: Vec<SyncSender<Event>>,
    /// `{"state": "loading"|"ready"|"failed", "progress": 0..1, "what": ...}`.
    status: Value,
    /// The model and configuration (set when ready).
    info: Value,
    recent: VecDeque<Value>,
    last_done: Value,
    heat: Value,
    /// Requests answered, refused with 429, cancelled by their client.
    served: u64,
    refused: u64,
    cancelled: u64,
}

/// The telemetry shared by the engine thread and the connections.
#[derive(Default)]
pub struct Hub {
    state: Mutex<State>,
}

impl Hub {
    pub fn new() -> Hub {
        let hub = Hub::default();
        hub.lock().status = json!({"state": "loading", "progress": 0.0, "what": "starting"});
        hub
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends an event to every subscriber (dropping those gone or too far behind).
    fn send(s: &mut State, name: &str, data: String) {
        let ev: Event = Arc::new((name.to_owned(), data));
        s.subscribers
            .retain(|tx| match tx.try_send(Arc::clone(&ev)) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            });
    }

    /// A new subscriber: it first gets the state, the info and the heatmap as they are.
    pub fn subscribe(&self) -> Receiver<Event> {
        let (tx, rx) = sync_channel(BACKLOG);
        let mut s = self.lock();
        for (name, v) in [("state", &s.status), ("info", &s.info), ("heat", &s.heat)] {
            if !v.is_null() {
                let _ = tx.try_send(Arc::new((name.to_owned(), v.to_string())));
            }
        }
        s.subscribers.push(tx);
        drop(s);
        rx
    }

    /// Subscribers connected now.
    pub fn subscribers(&self) -> usize {
        self.lock().subscribers.len()
    }

    /// The load's progress (0..1) and what it is doing (nothing once ready or failed).
    pub fn loading(&self, progress: f64, what: &str) {
        let mut s = self.lock();
        if s.status["state"] != "loading" {
            return;
        }
        s.status = json!({"state": "loading", "progress": progress.clamp(0.0, 1.0), "what": what});
        let d = s.status.to_string();
        Self::send(&mut s, "state", d);
    }

    /// The model is loaded: `info` describes it and its configuration.
    pub fn ready(&self, info: Value) {
        let mut s = self.lock();
        s.status = json!({"state": "ready", "progress": 1.0, "what": "ready"});
        s.info = info;
        let (st, inf) = (s.status.to_string(), s.info.to_string());
        Self::send(&mut s, "state", st);
        Self::send(&mut s, "info", inf);
    }

    /// The load failed.
    pub fn failed(&self, why: &str) {
        let mut s = self.lock();
        s.status = json!({"state": "failed", "progress": 0.0, "what": why});
        let d = s.status.to_string();
        Self::send(&mut s, "state", d);
    }

    /// Whether the model is ready to serve.
    pub fn is_ready(&self) -> bool {
        self.lock().status["state"] == "ready"
    }

    /// The state object.
    pub fn status(&self) -> Value {
        self.lock().status.clone()
    }

    /// A generated token's record.
    pub fn token(&self, record: Value) {
        let mut s = self.lock();
        if s.recent.len() == RECENT {
            s.recent.pop_front();
        }
        let d = record.to_string();
        s.recent.push_back(record);
        Self::send(&mut s, "token", d);
    }

    /// A generation's summary.
    pub fn done(&self, summary: Value) {
        let mut s = self.lock();
        s.served += 1;
        let d = summary.to_string();
        s.last_done = summary;
        Self::send(&mut s, "done", d);
    }

    /// The routing heatmap now.
    pub fn heat(&self, heat: Value) {
        let mut s = self.lock();
        let d = heat.to_string();
        s.heat = heat;
        Self::send(&mut s, "heat", d);
    }

    /// A request refused because the queue was full.
    pub fn refused(&self) {
        self.lock().refused += 1;
    }

    /// A request whose client left before it ended.
    pub fn cancelled(&self) {
        self.lock().cancelled += 1;
    }

    /// Everything known now: state, info, the recent token records, the last generation's
    /// summary, the heatmap and the request counts.
    pub fn summary(&self, queued: usize) -> Value {
        let s = self.lock();
        let mut o = Map::new();
        o.insert("status".into(), s.status.clone());
        o.insert("info".into(), s.info.clone());
        o.insert(
            "tokens".into(),
            Value::Array(s.recent.iter().cloned().collect()),
        );
        o.insert("last_done".into(), s.last_done.clone());
        o.insert("heat".into(), s.heat.clone());
        o.insert(
            "requests".into(),
            json!({"served": s.served, "refused": s.refused, "cancelled": s.cancelled,
                   "queued": queued}),
        );
        Value::Object(o)
    }
}

/// The four bars of a token as the spec's panel draws them (milliseconds): compute = CPU time
/// ÷ compute threads (an upper bound: the I/O lanes' CPU is in it), flash wait = the read time
/// (serial) or the stall (overlap), cache management, and the unattributed rest of the wall
/// time, clamped at 0 — never rescaled to the wall time.
pub fn bars(
    wall_ms: f64,
    cpu_ms: f64,
    threads: usize,
    io_ms: f64,
    stall_ms: f64,
    mgmt_ms: f64,
    overlap: bool,
) -> [f64; 4] {
    let compute = cpu_ms / threads.max(1) as f64;
    let flash = if overlap { stall_ms } else { io_ms };
    let rest = (wall_ms - compute - flash - mgmt_ms).max(0.0);
    [compute, flash, mgmt_ms, rest]
}

/// The `key=value` facts of a `# bmoe_metrics v2` preamble, as a JSON object (values as
/// the preamble writes them).
pub fn preamble_facts(preamble: &Preamble) -> Value {
    let o: Map<String, Value> = preamble
        .facts()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Value::String(v)))
        .collect();
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_clamp_the_rest_and_do_not_rescale() {
        // 2 threads: compute 40 of 80 cpu-ms; overlap reads the stall.
        assert_eq!(
            bars(100.0, 80.0, 2, 300.0, 30.0, 10.0, true),
            [40.0, 30.0, 10.0, 20.0]
        );
        // Serial reads the read time; the parts exceed the wall: the rest is 0, not negative.
        assert_eq!(
            bars(100.0, 160.0, 2, 50.0, 0.0, 5.0, false),
            [80.0, 50.0, 5.0, 0.0]
        );
    }

    #[test]
    fn subscribers_get_the_state_then_events_and_slow_ones_are_dropped() {
        let hub = Hub::new();
        let rx = hub.subscribe();
        let first = rx.try_recv().unwrap();
        assert_eq!(first.0, "state");
        hub.ready(json!({"model": "m"}));
        hub.token(json!({"step": 1}));
        let names: Vec<String> = rx.try_iter().map(|e| e.0.clone()).collect();
        assert_eq!(names, ["state", "info", "token"]);
        drop(rx);
        hub.token(json!({"step": 2}));
        assert_eq!(hub.subscribers(), 0);
        let s = hub.summary(0);
        assert_eq!(s["tokens"].as_array().map(Vec::len), Some(2));
        assert_eq!(s["status"]["state"], "ready");
    }

    #[test]
    fn preamble_facts_are_the_values_the_preamble_writes() {
        let p = Preamble {
            engine: "sluice".into(),
            version: "1.2.3".into(),
            model: "my model.gguf".into(),
            arch: "qwen3moe".into(),
            temp: 0.8,
            ..Preamble::default()
        };
        let v = preamble_facts(&p);
        assert_eq!(v["engine"], "sluice");
        assert_eq!(v["model"], "my model.gguf");
        assert_eq!(v["arch"], "qwen3moe");
        assert_eq!(v["temp"], "0.8");
        assert_eq!(v["prefetch_sync"], "0");
        // Without blanks in the path, the facts are exactly the `key=value` words the
        // preamble's text holds (what this page showed when it read them off the text).
        let p = Preamble {
            model: "m.gguf".into(),
            ..p
        };
        let mut words = Map::new();
        for line in p.to_string().lines().filter_map(|l| l.strip_prefix("# ")) {
            for kv in line.split_whitespace() {
                if let Some((k, v)) = kv.split_once('=') {
                    words.insert(k.to_owned(), Value::String(v.to_owned()));
                }
            }
        }
        assert_eq!(preamble_facts(&p), Value::Object(words));
    }
}
