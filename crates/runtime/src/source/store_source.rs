//! The engine's [`ExpertSource`] backed by the expert store: cache slots filled by the I/O
//! lanes, with the speculative reads ahead and their budget.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::Choice as _;
use crate::error::{Context, Result, fail};
use crate::notice::Notices;
use crate::settings::stream::{
    CachePolicy, PREDICT_SPEC_MAX, ReadAhead, ReadBackend, StreamConfig,
};
use engine::{ExpertProj, ExpertSource};
use gguf::GgufFile;
use store::{
    Backend, EvictionPolicy, ExpertCache, ExpertLayout, ExpertReader, IoLanes, IoMode, Lookup,
    PartKind, ReadDone, ReadFault, ReadJob,
};

use super::counters::{BatchView, StreamCounters};

const MIB: u64 = 1 << 20;

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
    io_trace: Option<Arc<std::sync::Mutex<crate::traces::IoTrace>>>,
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
    /// The speculative reads `settings` ask for, with route-ahead `route_ahead` layers early
    /// (which takes precedence: its reads are the committed routing).
    pub fn from_settings(settings: &StreamConfig, route_ahead: usize) -> Speculation {
        if route_ahead > 0 {
            Speculation::RouteAhead
        } else if settings.predict_prefetch {
            Speculation::StaleGate(settings.predict_spec_max.unwrap_or(PREDICT_SPEC_MAX))
        } else if settings.prefetch > 0 {
            Speculation::Temporal(settings.prefetch)
        } else {
            Speculation::Off
        }
    }

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
    /// The engine's expert source for `file` (named `name` in errors) as `settings` say, with a
    /// cache of `budget` bytes ([`crate::budget::Decision::cache_bytes`]); a budget below one
    /// token cycle is warned about.
    pub fn from_settings(
        settings: &StreamConfig,
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
            settings.cache_label(),
            settings.cache_policy.name(),
            mib(cycle),
            mib(layout.expert_bytes_total()),
            mib(layout.slot_bytes_total())
        ));
        // (In slots, as the cache charges them.)
        if budget > 0
            && budget < layout.token_cycle_slot_bytes()
            && settings.cache_policy == CachePolicy::Lru
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
            io: settings.io_mode(),
            lanes: settings.io_threads,
            backend: settings.backend(),
            overlap: settings.overlap,
            prompt_ahead: settings.prompt_ahead,
            early_load: !settings.no_early_load,
            load_all: settings.load_all,
            fault: settings.inject_read_fault,
            uring_fallback: settings.io_backend == ReadBackend::Auto,
            policy: settings.cache_policy,
        };
        let mut src = StoreSource::open(file, layout, cfg, counters, notices)
            .with_context(|| format!("{name}: cannot stream the experts"))?;
        if let Some((path, ahead)) = settings.couple_resolved()? {
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
            settings.io_threads,
            src.backend().name(),
            if settings.io_threads == 1 { "" } else { "s" },
            if src.direct() { "O_DIRECT" } else { "buffered" },
            if settings.overlap {
                ", overlapped with compute"
            } else {
                ""
            }
        ));
        Ok(src)
    }

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
    pub fn trace_io(&mut self, trace: Arc<std::sync::Mutex<crate::traces::IoTrace>>) {
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
        let of = |cfg: &StreamConfig, ahead| Speculation::from_settings(cfg, ahead);
        assert_eq!(of(&cfg, 0), Speculation::Temporal(2));
        cfg.predict_prefetch = true;
        assert_eq!(of(&cfg, 0), Speculation::StaleGate(PREDICT_SPEC_MAX));
        cfg.predict_spec_max = Some(0);
        assert_eq!(of(&cfg, 0), Speculation::StaleGate(0));
        assert_eq!(of(&cfg, 1), Speculation::RouteAhead);
        assert_eq!(of(&StreamConfig::default(), 0), Speculation::Off);
    }
}
