//! Expert streaming for `sluice run` / `sluice logits`: the engine's [`ExpertSource`] backed by
//! the expert store (layout, bounded cache, reader). Serial for now: a layer's misses are read
//! one after another before its experts are computed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use engine::{ExpertProj, ExpertSource};
use gguf::GgufFile;
use store::cache::AlignedBuf;
use store::{ExpertCache, ExpertLayout, ExpertReader, IoMode, Lookup, Lru, PartKind};

/// Counters shared with the run loop (the source itself moves into the engine).
#[derive(Debug, Default)]
pub struct StreamCounters {
    /// Bytes read from the files (whole aligned windows).
    pub read_bytes: AtomicU64,
    /// Nanoseconds spent in reads.
    pub io_ns: AtomicU64,
    /// Nanoseconds spent in cache bookkeeping (lookups, eviction).
    pub mgmt_ns: AtomicU64,
    pub lookups: AtomicU64,
    pub hits: AtomicU64,
    /// Bytes held in cache slots after the last batch.
    pub resident_bytes: AtomicU64,
}

impl StreamCounters {
    pub fn snapshot(&self) -> [u64; 6] {
        [
            self.read_bytes.load(Ordering::Relaxed),
            self.io_ns.load(Ordering::Relaxed),
            self.mgmt_ns.load(Ordering::Relaxed),
            self.lookups.load(Ordering::Relaxed),
            self.hits.load(Ordering::Relaxed),
            self.resident_bytes.load(Ordering::Relaxed),
        ]
    }
}

/// The engine's source of routed experts: cache slots filled by the reader.
pub struct StoreSource {
    layout: ExpertLayout,
    reader: ExpertReader,
    cache: ExpertCache<Lru>,
    counters: Arc<StreamCounters>,
    /// Per layer: index of gate, up and down in the layer's parts.
    proj_index: Vec<Option<[usize; 3]>>,
    seen: Vec<usize>,
    /// The misses of the batch being loaded (kept to reuse its allocation).
    misses: Vec<(u32, AlignedBuf)>,
    /// Reads in flight at once (one thread each) when a layer has several misses.
    lanes: usize,
}

impl StoreSource {
    /// A source for `file` (whose experts are `layout`) with a cache of `cache_bytes` (0: no
    /// cache).
    pub fn open(
        file: &GgufFile,
        layout: ExpertLayout,
        cache_bytes: u64,
        io: IoMode,
        lanes: usize,
        counters: Arc<StreamCounters>,
    ) -> Result<StoreSource> {
        let paths: Vec<_> = file.shards().iter().map(|s| s.path().to_owned()).collect();
        let reader = ExpertReader::open(&paths, &layout, io)?;
        let n_layer = layout.layers.iter().map(|l| l.layer + 1).max().unwrap_or(0) as usize;
        let mut proj_index = vec![None; n_layer];
        for l in &layout.layers {
            let find = |k: PartKind| l.parts.iter().position(|p| p.kind == k);
            match (
                find(PartKind::Gate),
                find(PartKind::Up),
                find(PartKind::Down),
            ) {
                (Some(g), Some(u), Some(d)) if l.parts.len() == 3 => {
                    proj_index[l.layer as usize] = Some([g, u, d]);
                }
                _ => bail!(
                    "layer {}: only separate gate, up and down expert tensors without biases \
                     can be streamed yet",
                    l.layer
                ),
            }
        }
        Ok(StoreSource {
            layout,
            reader,
            cache: ExpertCache::new(cache_bytes, Lru::default()),
            counters,
            proj_index,
            seen: Vec::new(),
            misses: Vec::new(),
            lanes: lanes.max(1),
        })
    }

    /// Whether the reads bypass the page cache.
    pub fn direct(&self) -> bool {
        self.reader.direct()
    }

    fn index(&self, layer: usize, proj: ExpertProj) -> Option<usize> {
        let [g, u, d] = (*self.proj_index.get(layer)?)?;
        Some(match proj {
            ExpertProj::Gate => g,
            ExpertProj::Up => u,
            ExpertProj::Down => d,
        })
    }
}

impl ExpertSource for StoreSource {
    fn proj_bytes(&self, layer: usize, proj: ExpertProj) -> Option<usize> {
        let i = self.index(layer, proj)?;
        let l = self.layout.layer(layer as u32)?;
        Some(l.parts[i].stride as usize)
    }

    fn load(&mut self, layer: usize, routed: &[usize]) -> Result<(), String> {
        let t0 = Instant::now();
        let mut io_ns = 0u64;
        let layer32 = layer as u32;
        let slot_bytes = self.reader.slot_bytes(layer32).map_err(|e| e.to_string())?;
        self.cache.begin_batch();
        self.seen.clear();
        let before = self.cache.stats();
        // Look every distinct expert up; the misses' slots are lent out to be filled.
        let mut misses = std::mem::take(&mut self.misses);
        for &e in routed {
            let key = (layer32, e as u32);
            // A repeat within the batch only refreshes recency.
            if self.seen.contains(&e) {
                self.cache.touch(key);
                continue;
            }
            self.seen.push(e);
            if self.cache.lookup(key, slot_bytes) == Lookup::Miss
                && let Some(buf) = self.cache.take_slot(key)
            {
                misses.push((key.1, buf));
            }
        }
        // Read them, on up to `lanes` threads at once.
        let t = Instant::now();
        let reader = &self.reader;
        let read_all = |group: &mut [(u32, AlignedBuf)]| -> Vec<(u32, String)> {
            group
                .iter_mut()
                .filter_map(|(e, buf)| {
                    reader
                        .read(layer32, *e, buf.as_mut_slice())
                        .err()
                        .map(|err| (*e, err.to_string()))
                })
                .collect()
        };
        let failed: Vec<(u32, String)> = if self.lanes <= 1 || misses.len() <= 1 {
            read_all(&mut misses)
        } else {
            let per = misses.len().div_ceil(self.lanes);
            std::thread::scope(|s| {
                let handles: Vec<_> = misses
                    .chunks_mut(per)
                    .map(|group| s.spawn(move || read_all(group)))
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| {
                        h.join()
                            .unwrap_or_else(|_| vec![(u32::MAX, "a read thread panicked".into())])
                    })
                    .collect()
            })
        };
        io_ns += t.elapsed().as_nanos() as u64;
        for (e, buf) in misses.drain(..) {
            self.cache.put_slot((layer32, e), buf);
        }
        self.misses = misses;
        let mut result = Ok(());
        if let Some((_, err)) = failed.first() {
            for (e, _) in &failed {
                self.cache.discard((layer32, *e));
            }
            result = Err(err.clone());
        }
        let after = self.cache.stats();
        let c = &self.counters;
        c.read_bytes
            .fetch_add(after.miss_bytes - before.miss_bytes, Ordering::Relaxed);
        c.lookups
            .fetch_add(after.lookups - before.lookups, Ordering::Relaxed);
        c.hits
            .fetch_add(after.hits - before.hits, Ordering::Relaxed);
        c.io_ns.fetch_add(io_ns, Ordering::Relaxed);
        let total = t0.elapsed().as_nanos() as u64;
        c.mgmt_ns
            .fetch_add(total.saturating_sub(io_ns), Ordering::Relaxed);
        if result.is_err() {
            // The layer will not be computed: end its batch now.
            self.cache.end_batch();
        }
        result
    }

    fn part(&self, layer: usize, expert: usize, proj: ExpertProj) -> &[u8] {
        let key = (layer as u32, expert as u32);
        let (Some(i), Some(slot)) = (self.index(layer, proj), self.cache.slot(key)) else {
            // The engine only asks for experts `load` made resident.
            return &[];
        };
        self.reader.part(key.0, key.1, i, slot).unwrap_or(&[])
    }

    fn release(&mut self, _layer: usize) {
        let t = Instant::now();
        self.cache.end_batch();
        let c = &self.counters;
        c.mgmt_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        c.resident_bytes
            .store(self.cache.used_bytes(), Ordering::Relaxed);
    }
}

/// Expert streaming flags shared by `run` and `logits`.
#[derive(clap::Args, Debug, Clone)]
pub struct StreamArgs {
    /// Stream routed experts from the model file into a bounded cache (`on`) instead of
    /// reading the whole model into memory (`off`). The output is the same bit for bit.
    #[arg(long, value_enum, default_value_t = StreamMode::Off, value_name = "MODE")]
    pub moe_stream: StreamMode,

    /// With --moe-stream on: the expert cache's budget: `auto` (decided once at load: available
    /// memory minus --cache-floor-mb minus the dense weights, at least 1500 MiB, at most every
    /// expert, and at most --cache-ceil-mb), a number of MiB (1 to 1499 only with
    /// --force-cache), or 0 to keep nothing (every routed expert is read every time it is used).
    #[arg(long, value_name = "auto|MiB")]
    pub cache_mb: Option<CacheMb>,

    /// With --cache-mb auto: memory to leave to the rest of the system, in MiB.
    #[arg(long, default_value_t = 1536, value_name = "MiB")]
    pub cache_floor_mb: u64,

    /// With --cache-mb auto: the most the cache may take, in MiB (0: no cap).
    #[arg(long, default_value_t = 0, value_name = "MiB")]
    pub cache_ceil_mb: u64,

    /// Accept a --cache-mb below 1500 MiB (which is usually below one token cycle of a large
    /// model, where an LRU cache hits nothing).
    #[arg(long)]
    pub force_cache: bool,

    /// With --moe-stream on: read experts through the page cache instead of with O_DIRECT.
    #[arg(long)]
    pub no_odirect: bool,

    /// With --moe-stream on: reads in flight at once when a layer misses several experts (one
    /// thread each).
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub io_threads: usize,
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

/// Below this, a fixed budget needs --force-cache (BigMoeOnEdge's `cache_min_mb`).
pub const CACHE_MIN_MB: u64 = 1500;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamMode {
    On,
    Off,
}

impl StreamArgs {
    /// Whether to stream; refuses flags that only mean something when streaming, and budgets in
    /// the refused band.
    pub fn streaming(&self) -> Result<bool> {
        let on = self.moe_stream == StreamMode::On;
        if !on && (self.cache_mb.is_some() || self.no_odirect || self.force_cache) {
            bail!("--cache-mb, --force-cache and --no-odirect need --moe-stream on");
        }
        if self.io_threads == 0 {
            bail!("--io-threads must be at least 1");
        }
        if let Some(CacheMb::Mib(mb)) = self.cache_mb
            && mb > 0
            && mb < CACHE_MIN_MB
            && !self.force_cache
        {
            bail!(
                "--cache-mb {mb} is below {CACHE_MIN_MB} MiB, where an LRU expert cache is usually \
                 smaller than one token's experts and hits nothing: use 0 (no cache), a larger \
                 budget, auto, or --force-cache"
            );
        }
        Ok(on)
    }

    /// The cache budget in bytes for `layout` (`auto` resolved from the available memory).
    pub fn cache_bytes(&self, layout: &ExpertLayout) -> Result<u64> {
        const MIB: u64 = 1 << 20;
        match self.cache_mb.unwrap_or(CacheMb::Auto) {
            CacheMb::Mib(mb) => mb
                .checked_mul(MIB)
                .with_context(|| format!("--cache-mb {mb} is too large")),
            CacheMb::Auto => {
                let min = CACHE_MIN_MB * MIB;
                let want = match mem_available() {
                    Some(avail) => avail
                        .saturating_sub(self.cache_floor_mb.saturating_mul(MIB))
                        .saturating_sub(layout.dense_bytes)
                        .max(min),
                    None => min,
                };
                let mut budget = want.min(layout.expert_bytes_total());
                if self.cache_ceil_mb > 0 {
                    budget = budget.min(self.cache_ceil_mb.saturating_mul(MIB));
                }
                Ok(budget)
            }
        }
    }

    /// The `cache` field of the `mode:` line.
    pub fn cache_label(&self) -> String {
        match self.cache_mb.unwrap_or(CacheMb::Auto) {
            CacheMb::Auto => "auto".to_owned(),
            CacheMb::Mib(0) => "off".to_owned(),
            CacheMb::Mib(mb) => format!("{mb} MiB"),
        }
    }

    /// The engine's expert source for `file` (named `name` in errors) with these flags: the
    /// budget is decided here, once, and a budget below one token cycle is warned about.
    pub fn source(
        &self,
        file: &GgufFile,
        name: &str,
        counters: Arc<StreamCounters>,
    ) -> Result<StoreSource> {
        let layout = ExpertLayout::from_gguf(file)
            .with_context(|| format!("{name}: cannot stream the experts"))?
            .with_context(|| format!("{name}: the model has no routed experts to stream"))?;
        let budget = self.cache_bytes(&layout)?;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let cycle = layout.token_cycle_bytes();
        eprintln!(
            "sluice: expert cache {:.0} MiB ({}); one token cycle is {:.1} MiB, all experts {:.1} MiB",
            mib(budget),
            self.cache_label(),
            mib(cycle),
            mib(layout.expert_bytes_total())
        );
        if budget > 0 && budget < cycle {
            eprintln!(
                "sluice: warning: the expert cache ({:.0} MiB) is smaller than one token cycle \
                 ({:.1} MiB): an LRU cache then evicts what the next token needs and hits almost \
                 nothing; --cache-mb 0 reads the same without holding the memory",
                mib(budget),
                mib(cycle)
            );
        }
        StoreSource::open(
            file,
            layout,
            budget,
            self.io_mode(),
            self.io_threads,
            counters,
        )
        .with_context(|| format!("{name}: cannot stream the experts"))
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
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Open `path` for running: mapped lazily when streaming (experts are read by the store, never
/// through the map), read into memory at once otherwise.
pub fn open_for(path: &std::path::Path, streaming: bool) -> Result<GgufFile> {
    if streaming {
        Ok(GgufFile::open(path)?)
    } else {
        crate::run::open_model(path)
    }
}
