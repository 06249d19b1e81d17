//! Expert streaming for `sluice run` / `sluice logits`: the engine's [`ExpertSource`] backed by
//! the expert store (layout, bounded cache, I/O lanes), the flags that configure it, and the
//! dense weights' placement.
//!
//! Serial mode: a layer's misses are all handed to the lanes at once and a one-token layer
//! computes when every one is in; a prompt batch (more than one token) computes each expert as
//! soon as its bytes are in, in file order, and its waits are its I/O time. `--overlap`: every
//! layer computes each expert as soon as its bytes are in — resident ones first — and waits only
//! when nothing ready is left; the wait is the stall. With `--prompt-ahead`, a prompt batch that
//! routes most of a layer's experts reads the next MoE layer's ahead
//! ([`StoreSource::prompt_ahead`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::Choice as _;
use crate::error::{Context, Error, Result, fail, reject};
use crate::notice::Notices;
use engine::{ExpertProj, ExpertSource};
use gguf::GgufFile;
use store::{
    Backend, EvictionPolicy, ExpertCache, ExpertLayout, ExpertReader, Forecast, IoLanes, IoMode,
    Lookup, Lru, PartKind, ReadDone, ReadFault, ReadJob,
};

/// Counters shared with the run loop (the source itself moves into the engine). All are
/// cumulative; a token's values are the difference of two [`snapshot`](Self::snapshot)s.
#[derive(Debug, Default)]
pub struct StreamCounters {
    /// Bytes read from the files (whole aligned windows).
    pub read_bytes: AtomicU64,
    /// Serial: wall time compute waited for reads. Overlap: the lanes' summed busy time.
    pub io_ns: AtomicU64,
    /// Overlap: wall time compute waited for a read (one thread waits, so the union of the
    /// stalled intervals is their sum).
    pub stall_ns: AtomicU64,
    /// Cache bookkeeping: lookups, issuing reads, collecting them, eviction.
    pub mgmt_ns: AtomicU64,
    /// Distinct experts looked up, and how many were in the cache.
    pub lookups: AtomicU64,
    pub hits: AtomicU64,
    pub evictions: AtomicU64,
    /// Misses of experts the cache had held before.
    pub rereads: AtomicU64,
    /// Bytes of the distinct routed experts (what the routing asked for, hit or miss).
    pub demand_bytes: AtomicU64,
    /// The most bytes one layer's batch routed.
    pub layer_demand_max: AtomicU64,
    /// Routed (token, expert) slots.
    pub routed: AtomicU64,
    /// Bytes held in cache slots after the last batch.
    pub resident_bytes: AtomicU64,
    /// Experts read ahead (co-activation prefetch), their bytes, and lookups that hit them.
    pub prefetches: AtomicU64,
    pub prefetch_bytes: AtomicU64,
    pub prefetch_hits: AtomicU64,
    /// Experts a prompt batch read ahead for the next MoE layer, their bytes, and lookups that
    /// hit them (apart from the `prefetch` counters, which are the readers ahead of decoding).
    pub prompt_ahead: AtomicU64,
    pub prompt_ahead_bytes: AtomicU64,
    pub prompt_ahead_hits: AtomicU64,
}

/// The counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamSnapshot {
    pub read_bytes: u64,
    pub io_ns: u64,
    pub stall_ns: u64,
    pub mgmt_ns: u64,
    pub lookups: u64,
    pub hits: u64,
    pub evictions: u64,
    pub rereads: u64,
    pub demand_bytes: u64,
    pub layer_demand_max: u64,
    pub routed: u64,
    pub resident_bytes: u64,
    pub prefetches: u64,
    pub prefetch_bytes: u64,
    pub prefetch_hits: u64,
    pub prompt_ahead: u64,
    pub prompt_ahead_bytes: u64,
    pub prompt_ahead_hits: u64,
}

impl StreamSnapshot {
    /// What happened between `earlier` and `self` (the two gauges, `layer_demand_max` and
    /// `resident_bytes`, are `self`'s).
    pub fn since(&self, earlier: &StreamSnapshot) -> StreamSnapshot {
        StreamSnapshot {
            read_bytes: self.read_bytes - earlier.read_bytes,
            io_ns: self.io_ns - earlier.io_ns,
            stall_ns: self.stall_ns - earlier.stall_ns,
            mgmt_ns: self.mgmt_ns - earlier.mgmt_ns,
            lookups: self.lookups - earlier.lookups,
            hits: self.hits - earlier.hits,
            evictions: self.evictions - earlier.evictions,
            rereads: self.rereads - earlier.rereads,
            demand_bytes: self.demand_bytes - earlier.demand_bytes,
            layer_demand_max: self.layer_demand_max,
            routed: self.routed - earlier.routed,
            resident_bytes: self.resident_bytes,
            prefetches: self.prefetches - earlier.prefetches,
            prefetch_bytes: self.prefetch_bytes - earlier.prefetch_bytes,
            prefetch_hits: self.prefetch_hits - earlier.prefetch_hits,
            prompt_ahead: self.prompt_ahead - earlier.prompt_ahead,
            prompt_ahead_bytes: self.prompt_ahead_bytes - earlier.prompt_ahead_bytes,
            prompt_ahead_hits: self.prompt_ahead_hits - earlier.prompt_ahead_hits,
        }
    }

    /// Hits per lookup in percent (0 without lookups).
    pub fn hit_pct(&self) -> f64 {
        store::cache::hit_pct(self.hits, self.lookups)
    }
}

impl StreamCounters {
    pub fn snapshot(&self) -> StreamSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StreamSnapshot {
            read_bytes: l(&self.read_bytes),
            io_ns: l(&self.io_ns),
            stall_ns: l(&self.stall_ns),
            mgmt_ns: l(&self.mgmt_ns),
            lookups: l(&self.lookups),
            hits: l(&self.hits),
            evictions: l(&self.evictions),
            rereads: l(&self.rereads),
            demand_bytes: l(&self.demand_bytes),
            layer_demand_max: l(&self.layer_demand_max),
            routed: l(&self.routed),
            resident_bytes: l(&self.resident_bytes),
            prefetches: l(&self.prefetches),
            prefetch_bytes: l(&self.prefetch_bytes),
            prefetch_hits: l(&self.prefetch_hits),
            prompt_ahead: l(&self.prompt_ahead),
            prompt_ahead_bytes: l(&self.prompt_ahead_bytes),
            prompt_ahead_hits: l(&self.prompt_ahead_hits),
        }
    }

    fn add(a: &AtomicU64, v: u64) {
        a.fetch_add(v, Ordering::Relaxed);
    }
}

/// What the last layer batch found: per distinct routed expert, its residency (the route
/// trace's: 0 a miss, 1 a hit, 2 a hit on an expert read ahead, at its first lookup since), and
/// the bytes its read pulls (0 for a hit). Shared with a route trace.
#[derive(Debug, Default)]
pub struct BatchView {
    pub layer: u32,
    pub entries: Vec<(u32, u8, u64)>,
}

impl BatchView {
    /// (residency, bytes read) of `expert` in the batch.
    pub fn get(&self, expert: u32) -> Option<(u8, u64)> {
        self.entries
            .iter()
            .find(|e| e.0 == expert)
            .map(|&(_, residency, bytes)| (residency, bytes))
    }
}

/// How the source is set up.
#[derive(Clone, Copy, Debug)]
pub struct SourceConfig {
    pub cache_bytes: u64,
    pub io: IoMode,
    pub lanes: usize,
    pub backend: Backend,
    pub overlap: bool,
    /// Prompt batches read the next MoE layer's experts ahead ([`StoreSource::prompt_ahead`]).
    pub prompt_ahead: bool,
    /// Take a layer's routing before its attention where the model knows it then
    /// (`ExpertSource::load_early`).
    pub early_load: bool,
    pub load_all: bool,
    pub fault: Option<ReadFault>,
    /// Fall back to pread lanes when the io_uring cannot be set up (`--io-backend auto`).
    pub uring_fallback: bool,
    /// Which cached expert leaves first.
    pub policy: CachePolicy,
}

/// Which cached expert leaves first (`--cache-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachePolicy {
    Forecast,
    Lru,
    Adaptive,
}

crate::choice!(CachePolicy {
    Forecast => "forecast", "The one whose next use is forecast farthest away, from each expert's frequency and whether it was routed at its layer's last visit, and the layer cycle (store::policy::Forecast, docs/policy.md)",
    Lru => "lru", "The least recently used",
    Adaptive => "adaptive", "Forecast or LRU, whichever a shadow cache kept by each has hit more with lately (set dueling; store::policy::Adaptive, docs/policy.md)",
});

impl CachePolicy {
    /// What a run evicts by when not told otherwise.
    pub const DEFAULT: CachePolicy = CachePolicy::Adaptive;

    /// The policy object for a model whose MoE layers are `layers`, routing `k` of
    /// `n_expert` experts.
    pub fn build(self, layers: &[u32], k: u32, n_expert: u32) -> Box<dyn EvictionPolicy + Send> {
        match self {
            CachePolicy::Forecast => Box::new(Forecast::new(layers, k, n_expert)),
            CachePolicy::Lru => Box::new(Lru::default()),
            CachePolicy::Adaptive => Box::new(store::Adaptive::new(layers, k, n_expert)),
        }
    }
}

/// Where one projection of a routed expert is in its cache slot.
#[derive(Debug, Clone, Copy)]
struct ProjAt {
    /// The index of its part in the layer's parts.
    part: usize,
    /// Its half of the part (gate 0, up 1 of a fused gate_up), or the whole part.
    half: Option<usize>,
}

/// The engine's source of routed experts: cache slots filled by the I/O lanes.
pub struct StoreSource {
    layout: ExpertLayout,
    /// Finds parts inside slots (its descriptors are not used for reading).
    reader: ExpertReader,
    lanes: IoLanes,
    cache: ExpertCache<Box<dyn EvictionPolicy + Send>>,
    counters: Arc<StreamCounters>,
    /// Per layer: where gate, up and down are: the index of their part in the layer's parts
    /// and their half of it (0, 1; `None` for a whole part), gate and up being the halves of
    /// a fused gate_up part.
    proj_index: Vec<Option<[ProjAt; 3]>>,
    /// Distinct experts of the batch being loaded.
    seen: Vec<usize>,
    /// Experts of the batch whose reads are in flight (of layer `batch_layer`).
    inflight: Vec<u32>,
    batch_layer: u32,
    /// A read error collected after its layer was done (`--load-all` under `--overlap`: an
    /// expert no token used), reported by the next load.
    deferred: Option<String>,
    /// The first read error of the batch.
    failed: Option<String>,
    overlap: bool,
    load_all: bool,
    /// Where each batch's lookups are published, when something watches them.
    view: Option<Arc<std::sync::Mutex<BatchView>>>,
    /// The `--io-trace` file.
    io_trace: Option<Arc<std::sync::Mutex<crate::telemetry::IoTrace>>>,
    /// Co-activation prefetch: the table, how many experts per layer, how many layers on.
    couple: Option<(store::Couple, ReadAhead)>,
    /// Experts whose read ahead is in flight.
    spec: std::collections::HashSet<(u32, u32)>,
    /// The MoE layers in order.
    moe_layers: Vec<u32>,
    /// Hits of the batch on experts read ahead (their first lookup since).
    ahead_hits: Vec<u32>,
    /// Which reads ahead the source makes besides `couple`'s.
    speculation: Speculation,
    /// `--prefetch`: each layer's distinct experts at its last one-token batch (or the last
    /// token of a prefill batch), by layer.
    prev: Vec<Vec<u32>>,
    /// `--predict-prefetch`: the stale gate's last ranking of each layer (until its batch), and
    /// how often each rank of it named an expert the layer then routed.
    predicted: Vec<Vec<u32>>,
    rank_hits: RankPrecision,
    /// The budget of speculative reads: lane time the demand reads left idle.
    spare: SpareLanes,
    /// Whether prompt batches read ahead ([`StoreSource::prompt_ahead`]).
    prompt_on: bool,
    /// Whether a routing known before the layer's attention is loaded then (`load_early`).
    early_on: bool,
    /// Experts a prompt batch read ahead ([`StoreSource::prompt_ahead`]) not looked up since.
    prompt_keys: std::collections::HashSet<(u32, u32)>,
    /// The prompt's reads ahead since the last [`publish`](StoreSource::publish): experts,
    /// bytes, and lookups that hit them (the cache counts them with the other reads ahead).
    prompt_batch: [u64; 3],
}

/// A prompt batch that routes at least `PROMPT_AHEAD_SHARE.0 / PROMPT_AHEAD_SHARE.1` of a
/// layer's experts has the next MoE layer's experts read ahead ([`StoreSource::prompt_ahead`]).
/// A one-token pass routes `k` of `n` (8 of 128 on Qwen3-30B-A3B) and never does; at this
/// share at most a quarter of the reads ahead can go unused.
pub const PROMPT_AHEAD_SHARE: (usize, usize) = (3, 4);

/// Which speculative reads a source makes (each its own `moe-prefetch:` tag).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Speculation {
    /// None (or only `--couple`'s table).
    #[default]
    Off,
    /// `--prefetch K`: after each one-token layer, the previous token's experts of the next
    /// `K` MoE layers.
    Temporal(usize),
    /// `--predict-prefetch`: the stale gate's predicted misses of the next layer, at most
    /// this many a layer (0: only keep the predicted residents).
    StaleGate(usize),
    /// `--route-ahead`: every committed expert not cached, read as soon as it is committed.
    RouteAhead,
}

impl Speculation {
    /// The `moe-prefetch:` line's tag.
    pub fn tag(self) -> &'static str {
        match self {
            Speculation::Off => "couple",
            Speculation::Temporal(_) => "",
            Speculation::StaleGate(_) => "stale-gate",
            Speculation::RouteAhead => "route-ahead",
        }
    }
}

/// The stale gate's measured confidence by rank: of the experts its ranking named at rank `r`,
/// how many the layer then routed. A predicted miss is read ahead only at a rank that has been
/// right at least half the time (a read more likely used than not; before any measurement the
/// even prior allows it).
#[derive(Debug, Default)]
struct RankPrecision {
    named: Vec<u64>,
    routed: Vec<u64>,
}

impl RankPrecision {
    /// Score `ranking` against the experts the layer routed.
    fn score(&mut self, ranking: &[u32], routed: &[usize]) {
        if self.named.len() < ranking.len() {
            self.named.resize(ranking.len(), 0);
            self.routed.resize(ranking.len(), 0);
        }
        for (r, &e) in ranking.iter().enumerate() {
            self.named[r] += 1;
            self.routed[r] += u64::from(routed.contains(&(e as usize)));
        }
    }

    /// Whether rank `r` has been right at least half the time (with one hit and one miss of
    /// prior).
    fn confident(&self, r: usize) -> bool {
        let (n, h) = (
            self.named.get(r).copied().unwrap_or(0),
            self.routed.get(r).copied().unwrap_or(0),
        );
        2 * (h + 1) >= n + 2
    }
}

/// The speculative reads' budget, measured: at each token boundary (the first MoE layer of a
/// one-token pass) the lane time of the token just done that demand reads left idle
/// (`lanes × wall − demand busy`) becomes the credit of the next, and each speculative read
/// is charged the lane time a read of its size has been taking (lane busy time per byte over
/// every read so far). A disk that is busy with demand reads leaves no credit, and a disk
/// that slows down under load charges more per read; nothing is assumed about its speed.
#[derive(Debug, Default)]
struct SpareLanes {
    lanes: u64,
    /// The last token boundary, with the demand busy time then.
    mark: Option<(Instant, u64)>,
    demand_busy_ns: u64,
    busy_ns: u64,
    bytes: u64,
    credit_ns: i128,
}

impl SpareLanes {
    fn read_done(&mut self, demand: bool, busy_ns: u64, bytes: u64) {
        if demand {
            self.demand_busy_ns += busy_ns;
        }
        self.busy_ns += busy_ns;
        self.bytes += bytes;
    }

    /// A token boundary: the token just done's idle lane time is the next one's credit.
    fn token(&mut self) {
        let now = Instant::now();
        if let Some((at, busy)) = self.mark {
            let wall = now.duration_since(at).as_nanos() as i128;
            let demand = i128::from(self.demand_busy_ns - busy);
            self.credit_ns = (i128::from(self.lanes) * wall - demand).max(0);
        }
        self.mark = Some((now, self.demand_busy_ns));
    }

    /// Charge a speculative read of `bytes`; `false` (nothing charged) when the credit does not
    /// cover it, or before anything has been measured.
    fn take(&mut self, bytes: u64) -> bool {
        if self.bytes == 0 {
            return false;
        }
        let cost = i128::from(bytes) * i128::from(self.busy_ns) / i128::from(self.bytes);
        if cost > self.credit_ns {
            return false;
        }
        self.credit_ns -= cost;
        true
    }
}

impl StoreSource {
    /// A source for `file` (whose experts are `layout`).
    pub fn open(
        file: &GgufFile,
        layout: ExpertLayout,
        cfg: SourceConfig,
        counters: Arc<StreamCounters>,
        notices: &Notices,
    ) -> Result<StoreSource> {
        let paths: Vec<_> = file.shards().iter().map(|s| s.path().to_owned()).collect();
        let lanes = match IoLanes::start(&paths, &layout, cfg.io, cfg.lanes, cfg.backend, cfg.fault)
        {
            // `--io-backend auto`: a ring the kernel refuses at this size falls back to pread.
            Err(e) if cfg.uring_fallback && cfg.backend == Backend::Uring => {
                notices.warn(format!(
                    "sluice: io_uring refused ({e}); reading with pread lanes"
                ));
                IoLanes::start(
                    &paths,
                    &layout,
                    cfg.io,
                    cfg.lanes,
                    Backend::Pread,
                    cfg.fault,
                )?
            }
            r => r?,
        };
        let reader = ExpertReader::open_as(&paths, &layout, false)?;
        let n_layer = layout.layers.iter().map(|l| l.layer + 1).max().unwrap_or(0) as usize;
        let mut proj_index = vec![None; n_layer];
        for l in &layout.layers {
            let find = |k: PartKind| l.parts.iter().position(|p| p.kind == k);
            let whole = |i| ProjAt {
                part: i,
                half: None,
            };
            let half = |i, h| ProjAt {
                part: i,
                half: Some(h),
            };
            match (
                find(PartKind::Gate),
                find(PartKind::Up),
                find(PartKind::GateUp),
                find(PartKind::Down),
            ) {
                // Bias parts (gpt-oss) ride along in the slot; the engine adds its resident
                // copies of them.
                (Some(g), Some(u), None, Some(d)) => {
                    proj_index[l.layer as usize] = Some([whole(g), whole(u), whole(d)]);
                }
                // experts without a gate: the engine never asks for one
                (None, Some(u), None, Some(d)) => {
                    proj_index[l.layer as usize] = Some([whole(u), whole(u), whole(d)]);
                }
                (None, None, Some(gu), Some(d)) => {
                    if l.parts[gu].stride % 2 != 0 {
                        fail!(
                            "layer {}: a fused gate_up expert of {} bytes has no halves",
                            l.layer,
                            l.parts[gu].stride
                        );
                    }
                    proj_index[l.layer as usize] = Some([half(gu, 0), half(gu, 1), whole(d)]);
                }
                _ => fail!(
                    "layer {}: the expert tensors are neither gate, up and down, a fused \
                     gate_up and down, nor up and down",
                    l.layer
                ),
            }
        }
        let budget = if cfg.load_all { 0 } else { cfg.cache_bytes };
        let layers: Vec<u32> = layout.layers.iter().map(|l| l.layer).collect();
        let policy = cfg
            .policy
            .build(&layers, layout.n_expert_used, layout.n_expert);
        let layers = layers.clone();
        Ok(StoreSource {
            layout,
            reader,
            lanes,
            cache: ExpertCache::new(budget, policy),
            counters,
            proj_index,
            seen: Vec::new(),
            inflight: Vec::new(),
            batch_layer: 0,
            deferred: None,
            failed: None,
            overlap: cfg.overlap,
            load_all: cfg.load_all,
            view: None,
            io_trace: None,
            couple: None,
            spec: std::collections::HashSet::new(),
            moe_layers: layers,
            ahead_hits: Vec::new(),
            speculation: Speculation::Off,
            prev: vec![Vec::new(); n_layer],
            predicted: vec![Vec::new(); n_layer],
            rank_hits: RankPrecision::default(),
            spare: SpareLanes {
                lanes: cfg.lanes as u64,
                ..SpareLanes::default()
            },
            prompt_on: cfg.prompt_ahead,
            early_on: cfg.early_load,
            prompt_keys: std::collections::HashSet::new(),
            prompt_batch: [0; 3],
        })
    }

    /// Record every read in `trace`.
    pub fn trace_io(&mut self, trace: Arc<std::sync::Mutex<crate::telemetry::IoTrace>>) {
        self.lanes.record_windows(true);
        self.io_trace = Some(trace);
    }

    /// Publish each batch's lookups to `view`.
    pub fn watch(&mut self, view: Arc<std::sync::Mutex<BatchView>>) {
        self.view = Some(view);
    }

    /// Whether the reads bypass the page cache.
    pub fn direct(&self) -> bool {
        self.lanes.direct()
    }

    /// The lanes' backend.
    pub fn backend(&self) -> Backend {
        self.lanes.backend()
    }

    fn index(&self, layer: usize, proj: ExpertProj) -> Option<ProjAt> {
        let [g, u, d] = (*self.proj_index.get(layer)?)?;
        Some(match proj {
            ExpertProj::Gate => g,
            ExpertProj::Up => u,
            ExpertProj::Down => d,
        })
    }

    /// Take a finished read back into the cache.
    fn collect(&mut self, done: ReadDone) {
        if let Some(t) = &self.io_trace {
            t.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .record(
                    done.layer,
                    done.expert,
                    done.lane,
                    !done.demand,
                    &done.windows,
                );
        }
        let key = (done.layer, done.expert);
        self.spec.remove(&key);
        self.cache.put_slot(key, done.buf);
        if done.layer == self.batch_layer {
            self.inflight.retain(|&e| e != done.expert);
        }
        if self.overlap {
            StreamCounters::add(&self.counters.io_ns, done.busy.as_nanos() as u64);
        }
        match done.result {
            Ok(bytes) => {
                StreamCounters::add(&self.counters.read_bytes, bytes);
                self.spare
                    .read_done(done.demand, done.busy.as_nanos() as u64, bytes);
            }
            Err(e) => {
                self.cache.discard(key);
                if self.failed.is_none() {
                    self.failed = Some(e.to_string());
                }
            }
        }
    }

    /// Read ahead, after each decode layer, the `ahead.k` experts of the next `ahead.depth` MoE
    /// layers that `couple` finds most likely to follow what the layer routed.
    pub fn set_couple(&mut self, couple: store::Couple, ahead: ReadAhead) {
        self.couple = Some((couple, ahead));
    }

    /// Issue the reads ahead that follow `layer`'s routing of one token (`distinct` experts).
    fn prefetch_next(&mut self, layer: u32, distinct: &[u32]) {
        let Some((couple, ReadAhead { k, depth })) = &self.couple else {
            return;
        };
        let Some(pos) = self.moe_layers.iter().position(|&l| l == layer) else {
            return;
        };
        let mut jobs = Vec::new();
        for d in 1..=*depth {
            let Some(&next) = self.moe_layers.get(pos + d as usize) else {
                break;
            };
            let Ok(slot) = self.reader.slot_bytes(next) else {
                break;
            };
            for e in couple.predict(layer, distinct, d, *k) {
                jobs.push((next, e, slot));
            }
        }
        for (next, e, slot) in jobs {
            // An earlier read ahead of it still in flight (its entry evicted meanwhile) will
            // fill it again: no second read.
            if self.spec.contains(&(next, e)) {
                continue;
            }
            if let Some(buf) = self.cache.prefetch((next, e), slot) {
                self.spec.insert((next, e));
                self.lanes.submit(ReadJob {
                    layer: next,
                    expert: e,
                    buf,
                    demand: false,
                });
            }
        }
    }

    /// Make the speculative reads of `speculation` (see [`Speculation`]).
    pub fn set_speculation(&mut self, speculation: Speculation) {
        self.speculation = speculation;
    }

    /// Read ahead `experts` of `layer` (in the order given, each with whether it may be read):
    /// each one cached is kept through the end of the current batch and costs nothing; of the
    /// others at most `max` are read, each only while the spare lane time covers it (when
    /// `budgeted`) and a lane is free of other reads ahead.
    fn speculate(
        &mut self,
        layer: u32,
        experts: impl IntoIterator<Item = (u32, bool)>,
        max: usize,
        budgeted: bool,
    ) {
        let Ok(slot) = self.reader.slot_bytes(layer) else {
            return;
        };
        let lanes = self.spare.lanes as usize;
        let mut issued = 0;
        for (e, may_read) in experts {
            let key = (layer, e);
            if self.cache.retain(key) || self.spec.contains(&key) || !may_read {
                continue;
            }
            if issued >= max || (budgeted && self.spec.len() >= lanes) {
                break;
            }
            if budgeted && !self.spare.take(slot as u64) {
                break;
            }
            let buf = if budgeted {
                self.cache.prefetch(key, slot)
            } else {
                // Not a guess (route-ahead's committed routing): kept until its layer comes.
                self.cache.prefetch_held(key, slot)
            };
            if let Some(buf) = buf {
                self.spec.insert(key);
                self.lanes.submit(ReadJob {
                    layer,
                    expert: e,
                    buf,
                    demand: false,
                });
                issued += 1;
            }
        }
    }

    /// `--prefetch K` after `layer`'s load: read ahead the previous token's experts of the
    /// next K MoE layers, then remember this batch's (a one-token batch's experts, or the last
    /// token's of a prefill batch).
    fn temporal(&mut self, layer: u32, routed: &[usize], depth: usize) {
        let k = self.layout.n_expert_used as usize;
        let one_token = routed.len() <= k;
        if one_token && let Some(pos) = self.moe_layers.iter().position(|&l| l == layer) {
            for d in 1..=depth {
                let Some(&next) = self.moe_layers.get(pos + d) else {
                    break;
                };
                let experts = std::mem::take(&mut self.prev[next as usize]);
                self.speculate(next, experts.iter().map(|&e| (e, true)), usize::MAX, true);
                self.prev[next as usize] = experts;
            }
        }
        let last = if one_token || k == 0 || !routed.len().is_multiple_of(k) {
            routed
        } else {
            &routed[routed.len() - k..]
        };
        if let Some(p) = self.prev.get_mut(layer as usize) {
            p.clear();
            for &e in last {
                if !p.contains(&(e as u32)) {
                    p.push(e as u32);
                }
            }
        }
    }

    /// After a prompt batch that routed `distinct` of `layer`'s experts, at least
    /// [`PROMPT_AHEAD_SHARE`] of them: the next MoE layer's batch (the same tokens) will route
    /// about as many, so each of its experts not cached is read ahead now, in file order,
    /// behind this layer's reads, and held for that layer; the lanes then read through this
    /// layer's experts' compute and the next layer's attention. Each read ahead first makes its
    /// room (never past the budget; it stops where the batch's and the held experts leave
    /// none). The cached ones are kept through this batch.
    fn prompt_ahead(&mut self, layer: u32, distinct: usize) {
        let n = self.layout.n_expert as usize;
        let (num, den) = PROMPT_AHEAD_SHARE;
        if !self.prompt_on || n == 0 || distinct * den < n * num {
            return;
        }
        let Some(pos) = self.moe_layers.iter().position(|&l| l == layer) else {
            return;
        };
        let Some(&next) = self.moe_layers.get(pos + 1) else {
            return;
        };
        let Ok(slot) = self.reader.slot_bytes(next) else {
            return;
        };
        for e in 0..n as u32 {
            let key = (next, e);
            if self.cache.retain(key) || self.spec.contains(&key) {
                continue;
            }
            if !self.cache.room_for(slot as u64) {
                break;
            }
            let Some(buf) = self.cache.prefetch_held(key, slot) else {
                continue;
            };
            self.spec.insert(key);
            self.prompt_keys.insert(key);
            self.prompt_batch[0] += 1;
            self.prompt_batch[1] += slot as u64;
            self.lanes.submit(ReadJob {
                layer: next,
                expert: e,
                buf,
                demand: false,
            });
        }
    }

    /// Give the cache's policy a usage history's counts as a prior.
    pub fn history(&mut self, counts: impl IntoIterator<Item = ((u32, u32), u64)>) {
        for (key, n) in counts {
            self.cache.history(key, n);
        }
    }

    /// Read `keys` (in that order) into pinned cache entries, never evicted; stops at the
    /// first that does not fit `max_bytes` of pins. Returns the pinned experts and bytes. A
    /// failed read is an error naming the expert.
    pub fn pin(&mut self, keys: &[(u32, u32)], max_bytes: u64) -> Result<(usize, u64)> {
        let mut n = 0;
        for &(layer, expert) in keys {
            let slot = self.reader.slot_bytes(layer)?;
            if self.cache.pinned_bytes() + slot as u64 > max_bytes {
                break;
            }
            if let Some(buf) = self.cache.pin((layer, expert), slot) {
                self.lanes.submit(ReadJob {
                    layer,
                    expert,
                    buf,
                    demand: true,
                });
                n += 1;
            }
        }
        self.batch_layer = u32::MAX;
        self.drain_all();
        if let Some(e) = self.failed.take() {
            fail!("pinning: {e}");
        }
        Ok((n, self.cache.pinned_bytes()))
    }

    /// Waits for every read in flight (reads ahead included), collecting each.
    fn drain_all(&mut self) {
        while let Some(done) = self.lanes.wait() {
            self.collect(done);
        }
    }

    /// Waits for reads, collecting each, while `more` holds (or none is left in flight).
    #[inline]
    fn drain_while(&mut self, more: impl Fn(&Self) -> bool) {
        while more(self) {
            let Some(done) = self.lanes.wait() else {
                break;
            };
            self.collect(done);
        }
    }

    /// Collects the reads already finished, without waiting.
    #[inline]
    fn collect_ready(&mut self) {
        while let Some(done) = self.lanes.poll() {
            self.collect(done);
        }
    }

    /// After a failed read: wait for the batch's other reads, then end the batch.
    fn fail(&mut self) -> String {
        self.drain_all();
        self.cache.end_batch();
        self.failed
            .take()
            .unwrap_or_else(|| "an expert read failed".to_owned())
    }

    /// A new layer batch: the reads of a batch the engine left without `release` (it stopped
    /// on an error) end first, and a read error deferred from the last `release` is reported.
    fn begin_load(&mut self, layer: u32) -> Result<(), String> {
        if self.lanes.in_flight() > self.spec.len() {
            self.drain_all();
            self.cache.end_batch();
        }
        self.inflight.clear();
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        self.batch_layer = layer;
        self.cache.begin_batch(layer);
        self.seen.clear();
        self.ahead_hits.clear();
        self.failed = None;
        Ok(())
    }

    /// Looks every distinct routed expert up (every expert with `--load-all`): `seen` gets
    /// them in order, `inflight` the misses and the hits still being read ahead.
    fn look_up(&mut self, layer: u32, routed: &[usize], slot_bytes: usize) {
        let all = 0..if self.load_all {
            self.layout.n_expert as usize
        } else {
            0
        };
        for e in routed.iter().copied().chain(all) {
            let key = (layer, e as u32);
            // A repeat within the batch only refreshes recency.
            if self.seen.contains(&e) {
                self.cache.touch(key);
                continue;
            }
            self.seen.push(e);
            let ahead = self.cache.stats().prefetch_hits;
            // A hit on an expert still being read ahead waits for that read.
            if self.cache.lookup(key, slot_bytes) == Lookup::Miss || self.spec.contains(&key) {
                self.inflight.push(key.1);
            }
            if self.cache.stats().prefetch_hits > ahead {
                self.ahead_hits.push(key.1);
                if self.prompt_keys.remove(&key) {
                    self.prompt_batch[2] += 1;
                }
            }
        }
    }

    /// What the batch found, for the route trace's watcher: each expert, whether it was a
    /// hit, and the bytes a miss reads.
    fn show_batch(&self, layer: u32) {
        let Some(view) = &self.view else {
            return;
        };
        let mut v = view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        v.layer = layer;
        v.entries.clear();
        for &e in &self.seen {
            let e = e as u32;
            let miss = self.inflight.contains(&e) && !self.ahead_hits.contains(&e);
            let bytes = if miss {
                self.reader
                    .windows(layer, e)
                    .map_or(0, |w| w.iter().map(|w| w.len as u64).sum())
            } else {
                0
            };
            let residency = if miss {
                0
            } else if self.ahead_hits.contains(&e) {
                2
            } else {
                1
            };
            v.entries.push((e, residency, bytes));
        }
    }

    /// Evicts for the misses before they take buffers (so that memory stays in the budget),
    /// then hands each miss's slot to the lanes to be filled; an expert being read ahead is
    /// already on its way.
    fn submit_misses(&mut self, layer: u32) {
        self.cache.make_room();
        // In file order (an expert's parts lie at its index in each expert tensor).
        self.inflight.sort_unstable();
        for &e in &self.inflight {
            let key = (layer, e);
            if self.spec.contains(&key) {
                continue;
            }
            if let Some(buf) = self.cache.take_slot(key) {
                self.lanes.submit(ReadJob {
                    layer,
                    expert: e,
                    buf,
                    demand: true,
                });
            }
        }
    }

    /// Cache statistics into the shared counters (after a batch); the prompt's reads ahead
    /// apart from the others.
    fn publish(&mut self, before: store::CacheStats) {
        let after = self.cache.stats();
        let [p_n, p_bytes, p_hits] = std::mem::take(&mut self.prompt_batch);
        let c = &self.counters;
        StreamCounters::add(&c.prompt_ahead, p_n);
        StreamCounters::add(&c.prompt_ahead_bytes, p_bytes);
        StreamCounters::add(&c.prompt_ahead_hits, p_hits);
        StreamCounters::add(&c.lookups, after.lookups - before.lookups);
        StreamCounters::add(&c.hits, after.hits - before.hits);
        StreamCounters::add(&c.evictions, after.evictions - before.evictions);
        StreamCounters::add(&c.rereads, after.rereads - before.rereads);
        StreamCounters::add(&c.prefetches, after.prefetches - before.prefetches - p_n);
        StreamCounters::add(
            &c.prefetch_bytes,
            after.prefetch_bytes - before.prefetch_bytes - p_bytes,
        );
        StreamCounters::add(
            &c.prefetch_hits,
            after.prefetch_hits - before.prefetch_hits - p_hits,
        );
    }
}

impl StoreSource {
    /// The layer's load (`ExpertSource::load`): look its routing up, submit the misses and
    /// the reads ahead; in serial mode a one-token layer then waits for its reads when `wait`
    /// (an early load leaves that wait to `next_ready`, after the attention).
    fn load_with(&mut self, layer: usize, routed: &[usize], wait: bool) -> Result<(), String> {
        let t0 = Instant::now();
        let layer32 = layer as u32;
        let slot_bytes = self.reader.slot_bytes(layer32).map_err(|e| e.to_string())?;
        let expert_bytes = self.layout.layer(layer32).map_or(0, |l| l.expert_bytes);
        self.begin_load(layer32)?;
        let before = self.cache.stats();
        self.look_up(layer32, routed, slot_bytes);
        self.show_batch(layer32);
        self.submit_misses(layer32);
        let routed_distinct = if self.load_all {
            let mut r: Vec<usize> = routed.to_vec();
            r.sort_unstable();
            r.dedup();
            r.len()
        } else {
            self.seen.len()
        } as u64;
        self.prompt_ahead(layer32, routed_distinct as usize);
        let one_token = routed.len() <= self.layout.n_expert_used as usize;
        if one_token && self.moe_layers.first() == Some(&layer32) {
            self.spare.token();
        }
        // One token's routing: read ahead what the next layers will likely route.
        if self.couple.is_some() && one_token {
            let distinct: Vec<u32> = self.seen.iter().map(|&e| e as u32).collect();
            self.prefetch_next(layer32, &distinct);
        }
        if one_token
            && let Some(p) = self.predicted.get_mut(layer)
            && !p.is_empty()
        {
            self.rank_hits.score(p, routed);
            p.clear();
        }
        if let Speculation::Temporal(depth) = self.speculation {
            self.temporal(layer32, routed, depth);
        }
        let demand = routed_distinct * expert_bytes;
        StreamCounters::add(&self.counters.routed, routed.len() as u64);
        StreamCounters::add(&self.counters.demand_bytes, demand);
        self.counters
            .layer_demand_max
            .fetch_max(demand, Ordering::Relaxed);
        let mut io_ns = 0u64;
        if wait && !self.overlap && one_token {
            // Serial: the layer computes once every read it needs is in (reads ahead for
            // later layers go on). A prompt batch computes each expert as its bytes come in,
            // as under --overlap (its waits count as I/O, see `next_ready`).
            let t = Instant::now();
            self.drain_while(|s| !s.inflight.is_empty());
            io_ns = t.elapsed().as_nanos() as u64;
            StreamCounters::add(&self.counters.io_ns, io_ns);
        }
        self.publish(before);
        let mut result = Ok(());
        if self.failed.is_some() {
            result = Err(self.fail());
        }
        let total = t0.elapsed().as_nanos() as u64;
        StreamCounters::add(&self.counters.mgmt_ns, total.saturating_sub(io_ns));
        result
    }
}

impl ExpertSource for StoreSource {
    fn proj_bytes(&self, layer: usize, proj: ExpertProj) -> Option<usize> {
        let at = self.index(layer, proj)?;
        let l = self.layout.layer(layer as u32)?;
        let whole = l.parts.get(at.part)?.stride as usize;
        Some(if at.half.is_some() { whole / 2 } else { whole })
    }

    fn load(&mut self, layer: usize, routed: &[usize]) -> Result<(), String> {
        self.load_with(layer, routed, true)
    }

    fn load_early(&mut self, layer: usize, routed: &[usize]) -> Result<bool, String> {
        if !self.early_on {
            return Ok(false);
        }
        // the reads go on during the attention; the layer's experts are waited for as they
        // are computed (`next_ready`), in serial mode too
        self.load_with(layer, routed, false)?;
        Ok(true)
    }

    fn next_ready(&mut self, _layer: usize, pending: &[usize]) -> Result<usize, String> {
        let t0 = Instant::now();
        let mut stall = 0u64;
        let result = loop {
            self.collect_ready();
            if self.failed.is_some() {
                break Err(self.fail());
            }
            if let Some(&e) = pending
                .iter()
                .find(|&&e| !self.inflight.contains(&(e as u32)))
            {
                break Ok(e);
            }
            let t = Instant::now();
            let done = self.lanes.wait();
            stall += t.elapsed().as_nanos() as u64;
            match done {
                Some(done) => self.collect(done),
                None => break Err("an expert to compute has no read in flight".to_owned()),
            }
        };
        let c = &self.counters;
        // Serial (a prompt batch): the wait is the time compute waited for reads, its I/O.
        StreamCounters::add(if self.overlap { &c.stall_ns } else { &c.io_ns }, stall);
        StreamCounters::add(
            &c.mgmt_ns,
            (t0.elapsed().as_nanos() as u64).saturating_sub(stall),
        );
        result
    }

    fn ready_now(
        &mut self,
        _layer: usize,
        pending: &[usize],
        ready: &mut Vec<usize>,
    ) -> Result<(), String> {
        let t0 = Instant::now();
        self.collect_ready();
        if self.failed.is_some() {
            return Err(self.fail());
        }
        ready.extend(
            pending
                .iter()
                .filter(|&&e| !self.inflight.contains(&(e as u32))),
        );
        StreamCounters::add(&self.counters.mgmt_ns, t0.elapsed().as_nanos() as u64);
        Ok(())
    }

    fn resident(&self, layer: usize, expert: usize) -> bool {
        // cached, or being read ahead into its slot: no new read
        self.cache.contains((layer as u32, expert as u32))
    }

    fn part(&self, layer: usize, expert: usize, proj: ExpertProj) -> &[u8] {
        let key = (layer as u32, expert as u32);
        let (Some(at), Some(slot)) = (self.index(layer, proj), self.cache.slot(key)) else {
            // The engine only asks for experts `load` made resident.
            return &[];
        };
        let bytes = self.reader.part(key.0, key.1, at.part, slot).unwrap_or(&[]);
        match at.half {
            None => bytes,
            Some(h) => {
                let n = bytes.len() / 2;
                &bytes[h * n..(h + 1) * n]
            }
        }
    }

    fn foresee(&mut self, layer: usize, ranked: &[usize], committed: bool) {
        let t = Instant::now();
        let before = self.cache.stats();
        match (self.speculation, committed) {
            (Speculation::StaleGate(max), false) => {
                // Read only at the ranks that have been right at least half the time.
                let confident = (0..ranked.len().min(64))
                    .filter(|&r| self.rank_hits.confident(r))
                    .fold(0u64, |m, r| m | 1 << r);
                if let Some(p) = self.predicted.get_mut(layer) {
                    p.clear();
                    p.extend(ranked.iter().map(|&e| e as u32));
                }
                let experts = (ranked.iter().enumerate())
                    .map(|(r, &e)| (e as u32, r < 64 && confident >> r & 1 == 1));
                self.speculate(layer as u32, experts, max, true);
            }
            (Speculation::RouteAhead, true) => {
                let experts = ranked.iter().map(|&e| (e as u32, true));
                self.speculate(layer as u32, experts, usize::MAX, false);
            }
            _ => {}
        }
        self.publish(before);
        StreamCounters::add(&self.counters.mgmt_ns, t.elapsed().as_nanos() as u64);
    }

    fn release(&mut self, _layer: usize) {
        let t = Instant::now();
        // Reads the layer did not wait for (--load-all under --overlap) end first; their
        // errors are reported by the next load. Reads ahead go on.
        self.drain_while(|s| s.lanes.in_flight() > s.spec.len());
        if let Some(e) = self.failed.take() {
            self.deferred = Some(e);
        }
        let before = self.cache.stats();
        self.cache.end_batch();
        let cache = &self.cache;
        self.prompt_keys.retain(|&k| cache.contains(k));
        self.publish(before);
        let c = &self.counters;
        StreamCounters::add(&c.mgmt_ns, t.elapsed().as_nanos() as u64);
        c.resident_bytes
            .store(self.cache.used_bytes(), Ordering::Relaxed);
    }
}

/// How far the co-activation read-ahead (`--couple`) reaches: experts per layer and MoE
/// layers ahead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadAhead {
    pub k: usize,
    pub depth: u32,
}

/// How a run streams its experts (the front end's expert-streaming settings; each field's
/// meaning is the flag of the same name in `sluice run --help`).
#[derive(Debug, Clone)]
pub struct StreamConfig {
    pub moe_stream: StreamMode,
    pub cache_mb: Option<CacheMb>,
    pub cache_policy: CachePolicy,
    pub couple: Option<PathBuf>,
    pub couple_k: Option<usize>,
    pub couple_d: Option<u32>,
    pub cache_floor_mb: u64,
    pub cache_ceil_mb: u64,
    pub force_cache: bool,
    pub no_odirect: bool,
    pub io_threads: usize,
    pub io_backend: ReadBackend,
    pub overlap: bool,
    /// Prompt batches read the next MoE layer's experts ahead (`--prompt-ahead`).
    pub prompt_ahead: bool,
    /// A layer's routing known before its attention (SmallThinker's router reads the layer's
    /// input) is not loaded until after it (`--no-early-load`, for comparison).
    pub no_early_load: bool,
    pub dense_weights: Option<DenseWeights>,
    pub load_all: bool,
    pub inject_read_fault: Option<ReadFault>,
    /// `--prefetch K`: the previous token's experts of the next K MoE layers read ahead.
    pub prefetch: usize,
    /// `--predict-prefetch`: the stale gate's predicted misses of the next layer read ahead.
    pub predict_prefetch: bool,
    /// `--predict-spec-max N`: at most N predicted misses read ahead a layer (0: only keep the
    /// predicted residents); `None` the default, [`PREDICT_SPEC_MAX`].
    pub predict_spec_max: Option<usize>,
}

/// Predicted misses read ahead per layer by default under `--predict-prefetch`: the stall a
/// read ahead removes is the wait on a layer's first missing expert.
pub const PREDICT_SPEC_MAX: usize = 2;

impl Default for StreamConfig {
    /// What `sluice run` does without streaming flags.
    fn default() -> StreamConfig {
        StreamConfig {
            moe_stream: StreamMode::Auto,
            cache_mb: None,
            cache_policy: CachePolicy::DEFAULT,
            couple: None,
            couple_k: None,
            couple_d: None,
            cache_floor_mb: 1536,
            cache_ceil_mb: 0,
            force_cache: false,
            no_odirect: false,
            io_threads: 4,
            io_backend: ReadBackend::Pread,
            overlap: false,
            prompt_ahead: false,
            no_early_load: false,
            dense_weights: None,
            load_all: false,
            inject_read_fault: None,
            prefetch: 0,
            predict_prefetch: false,
            predict_spec_max: None,
        }
    }
}

/// `--cache-mb`: `auto` or MiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMb {
    Auto,
    Mib(u64),
}

impl std::str::FromStr for CacheMb {
    type Err = String;

    fn from_str(s: &str) -> Result<CacheMb, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(CacheMb::Auto);
        }
        s.parse::<u64>()
            .map(CacheMb::Mib)
            .map_err(|_| format!("`{s}` is neither `auto` nor a number of MiB"))
    }
}

/// A read fault from its spelling, `LAYER:EXPERT` (an I/O error) or `LAYER:EXPERT:short` (the
/// file ending inside the expert): `--inject-read-fault`.
pub fn parse_read_fault(s: &str) -> Result<ReadFault, String> {
    let bad = || format!("`{s}` is not LAYER:EXPERT or LAYER:EXPERT:short");
    let mut it = s.split(':');
    let layer = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let expert = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let short = match it.next() {
        None => false,
        Some("short") => true,
        Some(_) => return Err(bad()),
    };
    if it.next().is_some() {
        return Err(bad());
    }
    Ok(ReadFault {
        layer,
        expert,
        short,
    })
}

/// Below this, a fixed budget needs --force-cache (BigMoeOnEdge's `cache_min_mb`).
pub const CACHE_MIN_MB: u64 = 1500;

/// Whether the experts stream (`--moe-stream`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamMode {
    Auto,
    On,
    Off,
}

crate::choice!(StreamMode {
    Auto => "auto", "",
    On => "on", "",
    Off => "off", "",
});

/// How the I/O lanes read (`--io-backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadBackend {
    Pread,
    Uring,
    Auto,
}

crate::choice!(ReadBackend {
    Pread => "pread", "",
    Uring => "uring", "",
    Auto => "auto", "",
});

/// Where the dense weights live when streaming (`--dense-weights`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseWeights {
    Anon,
    Mmap,
    Warm,
}

crate::choice!(DenseWeights {
    Anon => "anon", "",
    Mmap => "mmap", "",
    Warm => "warm", "",
});

/// Whether a run streams, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub stream: bool,
    /// Why, for the `mode:` line (empty when a flag said so).
    pub why: String,
}

const MIB: u64 = 1 << 20;

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

impl StreamConfig {
    /// Refuses flags that conflict, and budgets in the refused band (before anything is
    /// opened).
    pub fn validate(&self) -> Result<()> {
        if self.moe_stream == StreamMode::Off {
            let mut only_streaming = Vec::new();
            let flags = [
                (self.cache_mb.is_some(), "--cache-mb"),
                (self.force_cache, "--force-cache"),
                (self.no_odirect, "--no-odirect"),
                (self.overlap, "--overlap"),
                (self.prompt_ahead, "--prompt-ahead"),
                (self.dense_weights.is_some(), "--dense-weights"),
                (self.load_all, "--load-all"),
                (self.io_backend != ReadBackend::Pread, "--io-backend"),
                (self.inject_read_fault.is_some(), "--inject-read-fault"),
                (self.prefetch > 0, "--prefetch"),
                (self.predict_prefetch, "--predict-prefetch"),
            ];
            for (set, flag) in flags {
                if set {
                    only_streaming.push(flag);
                }
            }
            if !only_streaming.is_empty() {
                reject!(
                    "{} only apply when streaming: they conflict with --moe-stream off",
                    only_streaming.join(", ")
                );
            }
        }
        if self.io_threads == 0 || self.io_threads > 256 {
            reject!("--io-threads must be 1 to 256");
        }
        let readers_ahead = [
            (self.prefetch > 0, "--prefetch"),
            (self.predict_prefetch, "--predict-prefetch"),
            (self.couple.is_some(), "--couple"),
        ];
        let on: Vec<&str> = readers_ahead
            .iter()
            .filter(|(set, _)| *set)
            .map(|(_, f)| *f)
            .collect();
        if on.len() > 1 {
            reject!(
                "{} each read ahead on their own prediction: give one of them",
                on.join(" and ")
            );
        }
        if self.predict_spec_max.is_some() && !self.predict_prefetch {
            reject!("--predict-spec-max sets --predict-prefetch's reads: add --predict-prefetch");
        }
        if self.load_all && !matches!(self.cache_mb, None | Some(CacheMb::Mib(0))) {
            reject!(
                "--load-all reads every expert every time and keeps none: it conflicts with --cache-mb (other than 0)"
            );
        }
        if let Some(CacheMb::Mib(mb)) = self.cache_mb
            && mb > 0
            && mb < CACHE_MIN_MB
            && !self.force_cache
        {
            reject!(
                "--cache-mb {mb} is below {CACHE_MIN_MB} MiB, where an LRU expert cache is usually \
                 smaller than one token's experts and hits nothing: use 0 (no cache), a larger \
                 budget, auto, or --force-cache"
            );
        }
        if self.io_backend == ReadBackend::Uring && !store::uring_available() {
            reject!("--io-backend uring: io_uring is not available here (use pread or auto)");
        }
        Ok(())
    }

    /// Whether to stream `file`: as the flag says, or under `auto` when the model is larger
    /// than the available memory minus the floor (never for a model without routed experts).
    pub fn decide(&self, file: &GgufFile, layout: Option<&ExpertLayout>) -> Decision {
        let size = file.file_len();
        match (self.moe_stream, layout) {
            (StreamMode::Off, _) => Decision {
                stream: false,
                why: String::new(),
            },
            (StreamMode::On, _) => Decision {
                stream: true,
                why: String::new(),
            },
            (StreamMode::Auto, None) => Decision {
                stream: false,
                why: String::new(),
            },
            (StreamMode::Auto, Some(_)) => {
                let avail = available_memory();
                let floor = self.cache_floor_mb.saturating_mul(MIB);
                match avail {
                    Some(a) => {
                        let room = a.saturating_sub(floor);
                        Decision {
                            stream: size > room,
                            why: format!(
                                "auto: model {:.2} GiB {} available {:.2} GiB - floor {:.2} GiB",
                                gib(size),
                                if size > room { ">" } else { "<=" },
                                gib(a),
                                gib(floor)
                            ),
                        }
                    }
                    None => Decision {
                        stream: false,
                        why: "auto: available memory unknown".to_owned(),
                    },
                }
            }
        }
    }

    /// The cache budget in bytes for `layout` (`auto` resolved from the available memory).
    pub fn cache_bytes(&self, layout: &ExpertLayout) -> Result<u64> {
        if self.load_all {
            return Ok(0);
        }
        match self.cache_mb.unwrap_or(CacheMb::Auto) {
            CacheMb::Mib(mb) => mb
                .checked_mul(MIB)
                .ok_or_else(|| Error::Rejected(format!("--cache-mb {mb} is too large"))),
            CacheMb::Auto => {
                let min = CACHE_MIN_MB * MIB;
                let want = match available_memory() {
                    Some(avail) => avail
                        .saturating_sub(self.cache_floor_mb.saturating_mul(MIB))
                        .saturating_sub(layout.dense_bytes)
                        .max(min),
                    None => min,
                };
                // (At most what slots for every expert take, padding for aligned reads
                // included: what the cache charges.)
                let mut budget = want.min(layout.slot_bytes_total());
                if self.cache_ceil_mb > 0 {
                    budget = budget.min(self.cache_ceil_mb.saturating_mul(MIB));
                }
                Ok(budget)
            }
        }
    }

    /// The `cache` field of the `mode:` line.
    pub fn cache_label(&self) -> String {
        if self.load_all {
            return "off".to_owned();
        }
        match self.cache_mb.unwrap_or(CacheMb::Auto) {
            CacheMb::Auto => "auto".to_owned(),
            CacheMb::Mib(0) => "off".to_owned(),
            CacheMb::Mib(mb) => format!("{mb} MiB"),
        }
    }

    /// The dense weights' placement when streaming.
    pub fn dense(&self) -> DenseWeights {
        self.dense_weights.unwrap_or(DenseWeights::Anon)
    }

    /// The `mode:` line of a streaming run.
    pub fn mode_line(&self, why: &str) -> String {
        let mut line = format!(
            "mode: expert streaming, cache {}, dense {}",
            self.cache_label(),
            self.dense().name()
        );
        if self.overlap {
            line.push_str(", overlap");
        }
        if !why.is_empty() {
            line.push_str(&format!(" ({why})"));
        }
        line
    }

    fn backend(&self) -> Backend {
        match self.io_backend {
            ReadBackend::Pread => Backend::Pread,
            ReadBackend::Uring => Backend::Uring,
            ReadBackend::Auto if store::uring_available() => Backend::Uring,
            ReadBackend::Auto => Backend::Pread,
        }
    }

    /// The engine's expert source for `file` (named `name` in errors) with these flags and a
    /// cache of `budget` bytes ([`Opened::cache_bytes`]); a budget below one token cycle is
    /// warned about.
    pub fn source(
        &self,
        file: &GgufFile,
        layout: ExpertLayout,
        budget: u64,
        name: &str,
        counters: Arc<StreamCounters>,
        notices: &Notices,
    ) -> Result<StoreSource> {
        let mib = |b: u64| b as f64 / MIB as f64;
        let cycle = layout.token_cycle_bytes();
        notices.info(format!(
            "sluice: expert cache {:.0} MiB ({}, {} policy); one token cycle is {:.1} MiB, all \
             experts {:.1} MiB ({:.1} MiB in cache slots)",
            mib(budget),
            self.cache_label(),
            self.cache_policy.name(),
            mib(cycle),
            mib(layout.expert_bytes_total()),
            mib(layout.slot_bytes_total())
        ));
        // (In slots, as the cache charges them.)
        if budget > 0
            && budget < layout.token_cycle_slot_bytes()
            && self.cache_policy == CachePolicy::Lru
        {
            notices.warn(format!(
                "sluice: warning: the expert cache ({:.0} MiB) is smaller than one token cycle \
                 ({:.1} MiB): an LRU cache then evicts what the next token needs and hits almost \
                 nothing; --cache-mb 0 reads the same without holding the memory",
                mib(budget),
                mib(cycle)
            ));
        }
        let cfg = SourceConfig {
            cache_bytes: budget,
            io: self.io_mode(),
            lanes: self.io_threads,
            backend: self.backend(),
            overlap: self.overlap,
            prompt_ahead: self.prompt_ahead,
            early_load: !self.no_early_load,
            load_all: self.load_all,
            fault: self.inject_read_fault,
            uring_fallback: self.io_backend == ReadBackend::Auto,
            policy: self.cache_policy,
        };
        let mut src = StoreSource::open(file, layout, cfg, counters, notices)
            .with_context(|| format!("{name}: cannot stream the experts"))?;
        if let Some((path, ahead)) = self.couple_resolved()? {
            let (k, d) = (ahead.k, ahead.depth);
            let table = store::Couple::read(&path)?;
            notices.info(format!(
                "sluice: co-activation prefetch from {}: {k} experts of the next {} layer{}",
                path.display(),
                d,
                if d == 1 { "" } else { "s" }
            ));
            if budget == 0 {
                notices.warn(
                    "sluice: warning: --couple reads ahead into the cache; with --cache-mb 0 nothing is read ahead"
                );
            }
            src.set_couple(table, ahead);
        }
        notices.info(format!(
            "sluice: expert reads: {} {} lane{}, {}{}",
            self.io_threads,
            src.backend().name(),
            if self.io_threads == 1 { "" } else { "s" },
            if src.direct() { "O_DIRECT" } else { "buffered" },
            if self.overlap {
                ", overlapped with compute"
            } else {
                ""
            }
        ));
        Ok(src)
    }

    /// `--couple` (or COUPLE) with its K and depth (or COUPLE_K, COUPLE_D).
    pub fn couple_resolved(&self) -> Result<Option<(PathBuf, ReadAhead)>> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let Some(path) = self
            .couple
            .clone()
            .or_else(|| var("COUPLE").map(PathBuf::from))
        else {
            return Ok(None);
        };
        let k = match (self.couple_k, var("COUPLE_K")) {
            (Some(k), _) => k,
            (None, Some(v)) => v.trim().parse().map_err(|_| {
                Error::Rejected(format!("COUPLE_K={v}: expected a number of experts"))
            })?,
            (None, None) => 8,
        };
        let d = match (self.couple_d, var("COUPLE_D")) {
            (Some(d), _) => d,
            (None, Some(v)) => match v.trim() {
                "1" => 1,
                "2" => 2,
                _ => reject!("COUPLE_D={v}: expected 1 or 2"),
            },
            (None, None) => 1,
        };
        Ok(Some((path, ReadAhead { k, depth: d })))
    }

    /// The speculative reads these flags ask for, with route-ahead `route_ahead` layers early (which
    /// takes precedence: its reads are the committed routing).
    pub fn speculation(&self, route_ahead: usize) -> Speculation {
        if route_ahead > 0 {
            Speculation::RouteAhead
        } else if self.predict_prefetch {
            Speculation::StaleGate(self.predict_spec_max.unwrap_or(PREDICT_SPEC_MAX))
        } else if self.prefetch > 0 {
            Speculation::Temporal(self.prefetch)
        } else {
            Speculation::Off
        }
    }

    pub fn io_mode(&self) -> IoMode {
        if self.no_odirect {
            IoMode::Buffered
        } else {
            IoMode::Auto
        }
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_kib(&text, "MemAvailable:")?.checked_mul(1024)
}

fn meminfo_kib(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A `key value` line of a cgroup `memory.stat`.
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// What this process's memory cgroup still allows (limit minus usage, counting its inactive
/// page cache as free, as `MemAvailable` does), when it has a limit.
fn cgroup_available() -> Option<u64> {
    let me = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in me.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let path = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            // cgroup v1
            let dir = std::path::Path::new("/sys/fs/cgroup/memory").join(path);
            let read = |n: &str| -> Option<u64> {
                std::fs::read_to_string(dir.join(n))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            };
            let limit = read("memory.limit_in_bytes")?;
            if limit >= 1 << 60 {
                return None;
            }
            let usage = read("memory.usage_in_bytes")?;
            let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
            let inactive = stat_value(&stat, "total_inactive_file").unwrap_or(0);
            return Some(limit.saturating_sub(usage.saturating_sub(inactive)));
        }
        if controllers.is_empty() {
            // cgroup v2
            let dir = std::path::Path::new("/sys/fs/cgroup").join(path);
            let max = std::fs::read_to_string(dir.join("memory.max")).ok()?;
            let limit: u64 = max.trim().parse().ok()?;
            let usage: u64 = std::fs::read_to_string(dir.join("memory.current"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
            let inactive = stat_value(&stat, "inactive_file").unwrap_or(0);
            return Some(limit.saturating_sub(usage.saturating_sub(inactive)));
        }
    }
    None
}

/// Memory this process may still use: `MemAvailable`, or less under a cgroup limit.
pub fn available_memory() -> Option<u64> {
    match (mem_available(), cgroup_available()) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

/// A model opened for running.
pub struct Opened {
    pub file: GgufFile,
    /// Set when the experts are streamed.
    pub layout: Option<ExpertLayout>,
    /// The expert cache's budget, decided once, before the dense weights took memory.
    pub cache_bytes: u64,
    pub decision: Decision,
}

/// Open `path` for running with `args`: decide whether to stream; when streaming, place the
/// dense weights as --dense-weights says (experts are read by the store, never through the
/// map); otherwise read the whole file into memory.
/// `n_expert_used` (`--n-expert-used`) replaces the model's experts per token in the layout
/// (its cache sizing and token cycle).
pub fn open_for(
    path: &std::path::Path,
    args: &StreamConfig,
    n_expert_used: Option<u32>,
    notices: &Notices,
) -> Result<Opened> {
    args.validate()?;
    let name = path.display().to_string();
    let file = GgufFile::open(path)?;
    let mut why_not = None;
    let layout = match args.moe_stream {
        StreamMode::Off => None,
        StreamMode::On => ExpertLayout::from_gguf(&file)
            .with_context(|| format!("{name}: cannot stream the experts"))?,
        // Under auto a model whose experts cannot be streamed runs resident (and the model
        // loader names what is wrong with it, if anything).
        StreamMode::Auto => ExpertLayout::from_gguf(&file).unwrap_or_else(|e| {
            why_not = Some(format!("auto: the experts cannot be streamed: {e}"));
            None
        }),
    };
    // The engine keeps the experts' biases resident (gpt-oss): only the matrices stream.
    let mut layout = layout.map(ExpertLayout::without_biases);
    if let (Some(l), Some(k)) = (layout.as_mut(), n_expert_used) {
        crate::load::check_n_expert_used(k, l.n_expert, path)?;
        l.n_expert_used = k;
    }
    let mut decision = args.decide(&file, layout.as_ref());
    if let Some(why) = why_not {
        decision.why = why;
    }
    if !decision.stream {
        drop(file);
        return Ok(Opened {
            file: crate::load::open_model(path)?,
            layout: None,
            cache_bytes: 0,
            decision,
        });
    }
    let Some(layout) = layout else {
        fail!("{name}: the model has no routed experts to stream");
    };
    // Every expert byte must lie inside the files: a file cut short is refused here.
    for l in &layout.layers {
        for p in &l.parts {
            let end = p.expert_offset(layout.n_expert.saturating_sub(1)) + p.stride;
            let len = file.shards().get(p.shard).map_or(0, |s| s.file_len());
            if end > len {
                fail!(
                    "{name}: {} ends at byte {end}, past the end of its file ({len} bytes): the \
                     file is truncated",
                    p.tensor
                );
            }
        }
    }
    let cache_bytes = args.cache_bytes(&layout)?;
    // Routed experts and NextN layers stay out of the dense set.
    let experts: std::collections::HashSet<&str> = layout
        .layers
        .iter()
        .flat_map(|l| l.parts.iter().map(|p| p.tensor.as_str()))
        .chain(layout.nextn_tensors.iter().map(String::as_str))
        .collect();
    let experts: std::collections::HashSet<String> =
        experts.into_iter().map(str::to_owned).collect();
    let dense = |t: &gguf::TensorInfo| !experts.contains(&t.name);
    let file = match args.dense() {
        DenseWeights::Mmap => file,
        DenseWeights::Warm => {
            let t = Instant::now();
            let n = file.warm(&dense);
            notices.info(format!(
                "sluice: dense weights warmed: {:.1} MiB in {:.2} s",
                n as f64 / MIB as f64,
                t.elapsed().as_secs_f64()
            ));
            file
        }
        DenseWeights::Anon => {
            let t = Instant::now();
            let total = file.kept_bytes(&dense);
            let mut last = Instant::now();
            let mut progress = |done: u64, all: u64| {
                if last.elapsed().as_secs_f64() >= 1.0 && done < all {
                    notices.progress_of(
                        format!(
                            "sluice: reading dense weights: {:.0} of {:.0} MiB",
                            done as f64 / MIB as f64,
                            all as f64 / MIB as f64
                        ),
                        done,
                        all,
                    );
                    last = Instant::now();
                }
            };
            let file = file
                .into_anon(&dense, !args.no_odirect, &mut progress)
                .with_context(|| format!("{name}: cannot read the dense weights"))?;
            notices.info(format!(
                "sluice: dense weights read into memory: {:.1} MiB in {:.2} s",
                total as f64 / MIB as f64,
                t.elapsed().as_secs_f64()
            ));
            file
        }
    };
    Ok(Opened {
        file,
        layout: Some(layout),
        cache_bytes,
        decision,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_lane_time_is_what_demand_reads_left_idle_and_reads_ahead_spend_it() {
        let mut s = SpareLanes {
            lanes: 2,
            ..SpareLanes::default()
        };
        // nothing measured yet: nothing is read ahead
        assert!(!s.take(1));
        s.read_done(true, 1_000, 1_000);
        s.token();
        assert!(!s.take(1), "no credit before a whole token was measured");
        // a token of at least 1 ms on 2 lanes with 0.5 ms of demand reads in it
        let at = Instant::now() - std::time::Duration::from_millis(1);
        s.mark = Some((at, s.demand_busy_ns));
        s.read_done(true, 500_000, 500_000);
        s.token();
        // reads have taken 1 ns of lane time a byte: the credit is at least 1.5 ms of lane time
        assert!(s.credit_ns >= 1_500_000, "{}", s.credit_ns);
        let credit = s.credit_ns;
        assert!(s.take(1_000_000));
        assert_eq!(s.credit_ns, credit - 1_000_000);
        assert!(!s.take(credit as u64), "a read the credit does not cover");
        // a token whose demand reads kept both lanes busy leaves no credit
        s.mark = Some((Instant::now(), s.demand_busy_ns));
        s.read_done(true, 10_000_000_000, 1);
        s.token();
        assert_eq!(s.credit_ns, 0);
        // reads ahead count in the cost per byte but not as demand
        let before = s.demand_busy_ns;
        s.read_done(false, 5, 5);
        assert_eq!(s.demand_busy_ns, before);
    }

    #[test]
    fn a_rank_is_read_ahead_only_while_it_has_been_right_half_the_time() {
        let mut p = RankPrecision::default();
        // nothing measured: the even prior reads every rank
        assert!(p.confident(0) && p.confident(7));
        // rank 0 right three times, rank 1 once, rank 2 never
        for routed in [[5usize, 6], [5, 9], [5, 8]] {
            p.score(&[5, 6, 7], &routed);
        }
        assert!(p.confident(0));
        assert!(!p.confident(1), "1 of 3 (with the prior 2 of 5)");
        assert!(!p.confident(2));
        p.score(&[5, 6, 7], &[6, 1]);
        assert!(p.confident(1), "2 of 4 (with the prior 3 of 6)");
        assert!(p.confident(3), "an unmeasured rank keeps the prior");
    }

    #[test]
    fn route_ahead_then_the_stale_gate_then_the_previous_token_decide_the_reads_ahead() {
        let mut cfg = StreamConfig {
            prefetch: 2,
            ..StreamConfig::default()
        };
        assert_eq!(cfg.speculation(0), Speculation::Temporal(2));
        cfg.predict_prefetch = true;
        assert_eq!(cfg.speculation(0), Speculation::StaleGate(PREDICT_SPEC_MAX));
        cfg.predict_spec_max = Some(0);
        assert_eq!(cfg.speculation(0), Speculation::StaleGate(0));
        assert_eq!(cfg.speculation(1), Speculation::RouteAhead);
        assert_eq!(StreamConfig::default().speculation(0), Speculation::Off);
        // two readers ahead at once are refused, and so is a spec max without its reader
        assert!(cfg.validate().is_err());
        let lone = StreamConfig {
            predict_spec_max: Some(1),
            ..StreamConfig::default()
        };
        assert!(lone.validate().is_err());
        let off = StreamConfig {
            moe_stream: StreamMode::Off,
            prefetch: 1,
            ..StreamConfig::default()
        };
        assert!(off.validate().is_err());
        let off = StreamConfig {
            moe_stream: StreamMode::Off,
            prompt_ahead: true,
            ..StreamConfig::default()
        };
        assert!(off.validate().is_err());
    }
}
