//! `sluice bench`: sluice and a peer engine — llama.cpp's `llama-completion`, or BigMoeOnEdge's
//! `bmoe-cli` (`--peer bmoe`) — side by side on the same model, prompt, token count and
//! threads, alternating A B A B, each run starting with the model evicted from the page cache,
//! optionally under a cgroup v1 memory cap, next to a disk and a DRAM calibration taken in the
//! same invocation. Writes a markdown report (appended to a file such as docs/benchmarks.md)
//! and a PNG chart.
//!
//! What each figure is:
//! * prefill / decode tok/s: each engine's own timing lines (sluice: `prompt ... prefill` on
//!   standard error and `generation:`; llama.cpp: `prompt eval time` and `eval time`;
//!   bmoe-cli: `generation:` and `prefill:`);
//! * load s and time to first token: sluice's `loaded ... in S s` (TTFT = load + prefill),
//!   bmoe-cli's `prefill: ... | model load S s | TTFT S s` (the same definition);
//! * engine MiB/token and hit %: the streaming engines' own `moe-stream:` / `moe-cache:` lines;
//! * read MiB/token: the block-layer reads of the whole process (`getrusage` of the child:
//!   load, prefill and decode) divided by the generated tokens;
//! * peak RSS: the child's maximum resident set; under a cap also the cgroup's peak usage,
//!   page cache included;
//! * bound: the physical limit per token, min(disk ÷ missed bytes, DRAM ÷ touched bytes), with
//!   missed bytes = the measured read bytes per token and touched bytes = every dense weight
//!   (one row of the embedding) plus top-k experts of every layer.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use gguf::GgufFile;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The model both engines run (GGUF).
    #[arg(short, long, value_name = "MODEL")]
    model: PathBuf,

    /// The engine sluice is measured against: `llama` (llama.cpp's `llama-completion`) or
    /// `bmoe` (BigMoeOnEdge's `bmoe-cli`, built by scripts/build_bmoe.sh).
    #[arg(long, value_enum, default_value_t = Peer::Llama)]
    peer: Peer,

    /// The `bmoe-cli` executable for `--peer bmoe` [default: the one scripts/build_bmoe.sh
    /// builds, `$SLUICE_BMOE/src/build/cli/bmoe-cli`, else
    /// `~/.cache/sluice/bmoe-2d4f2b1/src/build/cli/bmoe-cli`].
    #[arg(long, value_name = "FILE")]
    bmoe_bin: Option<PathBuf>,

    /// Also run llama.cpp v0.4.0 as shipped in every round, after the peer: npm's prebuilt
    /// libraries with their default settings (memory map, weights repacked where the CPU
    /// backend repacks them, the best CPU library for this CPU), through the
    /// scripts/bench_llamacpp.cpp driver that scripts/build_bench_llamacpp.sh builds. The
    /// report gives every sluice variant's decode ratio against it as well as against the peer.
    #[arg(long)]
    with_llama: bool,

    /// The driver for --with-llama [default: `$SLUICE_LLAMACPP_NPM/bench_llamacpp`, else
    /// `~/.cache/sluice/llamacpp-npm/bench_llamacpp`]; its CPU libraries are read from the
    /// `cpu/` directory beside it.
    #[arg(long, value_name = "FILE", requires = "with_llama")]
    llama_driver: Option<PathBuf>,

    /// A labelled peer configuration, `LABEL=ARGS` (ARGS added after --llama-args, split at
    /// white space); repeat for several, e.g. `--peer-variant 'overlap=--moe-stream --overlap
    /// --cache-mb 4000'`. Each round runs every sluice variant, then every peer variant; each
    /// sluice run's ratio is against the round's first peer run, and the report gives the
    /// median ratio of every sluice variant to every peer variant. Without it: one peer run.
    #[arg(long, value_name = "LABEL=ARGS", allow_hyphen_values = true)]
    peer_variant: Vec<String>,

    /// Directory holding llama.cpp's `llama-completion` [default: the one
    /// scripts/build_llamacpp.sh builds, `$SLUICE_LLAMACPP/build/bin`, else
    /// `~/.cache/sluice/llama.cpp-0.3.36/build/bin`].
    #[arg(long, value_name = "DIR")]
    llama_bin: Option<PathBuf>,

    /// The prompt (raw text, no chat template, for both engines).
    #[arg(
        short,
        long,
        default_value = "Explain what a mixture of experts is.",
        value_name = "TEXT"
    )]
    prompt: String,

    /// Tokens to generate per run (greedy, end of generation ignored).
    #[arg(short = 'n', long, default_value_t = 32, value_name = "N")]
    n_predict: usize,

    /// Threads of each engine [default: every core available].
    #[arg(short, long, value_name = "N")]
    threads: Option<usize>,

    /// Context size of both engines.
    #[arg(short = 'c', long, default_value_t = 512, value_name = "N")]
    ctx: usize,

    /// Rounds; each runs the sluice variants, then the peer's. The sluice variants' order
    /// turns by one each round (round 2 starts with the second), so that none is always
    /// first after the reference's run: on identical work the first measured up to 15 % apart.
    #[arg(long, default_value_t = 2, value_name = "N")]
    rounds: usize,

    /// Run both engines in a cgroup v1 memory group limited to this many MiB (page cache
    /// included; needs root and /sys/fs/cgroup/memory). An error when it cannot be made.
    #[arg(long, value_name = "MiB")]
    mem_cap_mb: Option<u64>,

    /// Extra arguments for `sluice run`, one string split at white space (e.g.
    /// "--route-replay trace.csv").
    #[arg(long, allow_hyphen_values = true, value_name = "ARGS")]
    sluice_args: Option<String>,

    /// A labelled sluice configuration, `LABEL=ARGS` (ARGS added after --sluice-args, split at
    /// white space); repeat for several. Each round runs every variant, then llama.cpp once,
    /// and each variant's ratio is against that llama.cpp run. Without it: one variant,
    /// `sluice`.
    #[arg(long, value_name = "LABEL=ARGS", allow_hyphen_values = true)]
    variant: Vec<String>,

    /// Extra arguments for the peer (`llama-completion` or `bmoe-cli`), split at white space
    /// (e.g. "--no-repack").
    #[arg(
        long,
        visible_alias = "peer-args",
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    llama_args: Option<String>,

    /// Start every run with the model file read through the page cache (resident, warm: the
    /// load reads no disk) instead of evicted from it. Not with --mem-cap-mb.
    #[arg(long, conflicts_with = "mem_cap_mb")]
    warm: bool,

    /// Seconds of each calibration (disk, DRAM).
    #[arg(long, default_value_t = 5.0, value_name = "S")]
    calib_secs: f64,

    /// Append the markdown report to this file (e.g. docs/benchmarks.md); it is always printed.
    #[arg(long, value_name = "FILE.md")]
    append: Option<PathBuf>,

    /// Draw decode tok/s per run into this PNG.
    #[arg(long, value_name = "FILE.png")]
    png: Option<PathBuf>,

    /// TrueType font for the chart [default: a system sans-serif font].
    #[arg(long, value_name = "FILE.ttf", requires = "png")]
    font: Option<PathBuf>,

    /// A title for the report section.
    #[arg(long, value_name = "TEXT")]
    label: Option<String>,
}

/// The engine name of the `--with-llama` reference in the report.
const LLAMA_SHIPPED: &str = "llama.cpp v0.4.0";

/// The engine sluice is compared with.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// llama.cpp's `llama-completion`, built by scripts/build_llamacpp.sh from the 0.5.0-dev
    /// tree that llama-cpp-python 0.3.36 vendors.
    Llama,
    /// BigMoeOnEdge's `bmoe-cli` (its plain mode is llama.cpp v0.4.0 on mmap, no repacking;
    /// `--moe-stream` streams the experts).
    Bmoe,
}

impl Peer {
    fn engine(self) -> &'static str {
        match self {
            Peer::Llama => "llama.cpp 0.5.0-dev",
            Peer::Bmoe => "bmoe-cli",
        }
    }
}

/// One engine run's figures.
#[derive(Clone, Debug, Default)]
struct RunResult {
    engine: &'static str,
    /// The sluice variant's label (empty for llama.cpp and the default variant).
    label: String,
    round: usize,
    prefill_tps: Option<f64>,
    decode_tps: Option<f64>,
    n_gen: usize,
    /// Block-layer reads of the whole run.
    read_bytes: u64,
    /// Block-layer reads during the decode (estimated from samples of /proc/PID/io over the
    /// last `n_gen / decode_tps` seconds of the run).
    decode_read_bytes: Option<u64>,
    hit_pct: Option<f64>,
    /// Model load seconds and time to first token (load + prefill), from the engine's lines.
    load_s: Option<f64>,
    ttft_s: Option<f64>,
    /// Expert bytes read per generated token, from the engine's `moe-stream:` line.
    stream_mib_tok: Option<f64>,
    max_rss_kib: u64,
    major_faults: u64,
    cgroup_peak: Option<u64>,
    wall_s: f64,
}

/// The cgroup v1 memory group the runs go into.
struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    fn create(limit_mib: u64) -> Result<Cgroup> {
        let root = Path::new("/sys/fs/cgroup/memory");
        if !root.join("cgroup.procs").is_file() {
            bail!(
                "--mem-cap-mb: no cgroup v1 memory hierarchy at {} (the cap cannot be made here)",
                root.display()
            );
        }
        let dir = root.join(format!("sluice-bench-{}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| {
            format!(
                "--mem-cap-mb: cannot create {} (root is needed; the cap cannot be made)",
                dir.display()
            )
        })?;
        let cg = Cgroup { dir };
        cg.write("memory.limit_in_bytes", &(limit_mib << 20).to_string())?;
        Ok(cg)
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        std::fs::write(self.dir.join(file), value)
            .with_context(|| format!("writing {value} to {}", self.dir.join(file).display()))
    }

    fn read_u64(&self, file: &str) -> Option<u64> {
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Empty once its processes have exited.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Drop the file's pages from the page cache; returns the share still cached afterwards.
/// Read the whole file through the page cache; the share of its pages cached afterwards.
fn warm(path: &Path) -> Result<f64> {
    let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open for the
    // whole call. A refused hint only costs speed.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
    }
    cached_share(&f)
}

fn evict(path: &Path) -> Result<f64> {
    let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open for the
    // whole call.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        bail!(
            "posix_fadvise(DONTNEED) on {}: {}",
            path.display(),
            std::io::Error::from_raw_os_error(rc)
        );
    }
    cached_share(&f)
}

/// The share of a file's pages in the page cache (`mincore` over a mapping of it).
fn cached_share(f: &File) -> Result<f64> {
    let len = f.metadata()?.len() as usize;
    if len == 0 {
        return Ok(0.0);
    }
    // SAFETY: the mapping is read-only and only its residency is queried; nothing reads the
    // bytes, so a concurrent change of the file cannot be observed through it.
    let map = unsafe { memmap2::Mmap::map(f) }?;
    let page = 4096usize;
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `len` bytes at a page-aligned address, and `vec` has
    // one byte per page of it, as mincore requires.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("mincore");
    }
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages as f64)
}

/// Disk calibration: 1 MiB reads at random 1 MiB-aligned offsets of `path` with O_DIRECT,
/// 16 in flight (16 threads), for `secs`. Returns (MB/s, p50 ms, p99 ms).
fn calibrate_disk(path: &Path, secs: f64) -> Result<(f64, f64, f64)> {
    const BLOCK: usize = 1 << 20;
    const DEPTH: usize = 16;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("opening {} with O_DIRECT", path.display()))?;
    let blocks = f.metadata()?.len() / BLOCK as u64;
    if blocks == 0 {
        bail!("{} is smaller than one 1 MiB read", path.display());
    }
    let total = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let lat: Vec<Vec<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..DEPTH)
            .map(|i| {
                let (f, total) = (&f, &total);
                s.spawn(move || -> std::io::Result<Vec<f64>> {
                    let mut raw = vec![0u8; BLOCK + 4096];
                    let skip = raw.as_ptr().align_offset(4096);
                    let buf = &mut raw[skip..skip + BLOCK];
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1);
                    let mut lat = Vec::new();
                    while Instant::now() < deadline {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let off = (x % blocks) * BLOCK as u64;
                        let t = Instant::now();
                        let n = f.read_at(buf, off)?;
                        lat.push(t.elapsed().as_secs_f64() * 1e3);
                        total.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Ok(lat)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Ok(Vec::new())))
            .collect::<std::io::Result<Vec<_>>>()
    })
    .with_context(|| format!("direct reads of {}", path.display()))?;
    let secs = start.elapsed().as_secs_f64();
    let mut all: Vec<f64> = lat.into_iter().flatten().collect();
    all.sort_by(f64::total_cmp);
    let pct = |p: f64| all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)));
    Ok((
        total.load(Ordering::Relaxed) as f64 / 1e6 / secs,
        pct(0.5).copied().unwrap_or(0.0),
        pct(0.99).copied().unwrap_or(0.0),
    ))
}

/// DRAM read calibration: `threads` threads summing disjoint parts of a 1 GiB buffer, passes
/// for `secs`; the best pass in GB/s.
fn calibrate_dram(threads: usize, secs: f64) -> f64 {
    let words = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let part = words.div_ceil(threads);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut best = 0f64;
    while Instant::now() < deadline || best == 0.0 {
        let t = Instant::now();
        let sum: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = buf
                .chunks(part)
                .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &v| a.wrapping_add(v))))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / 1e9 / t.elapsed().as_secs_f64());
    }
    best
}

/// Bytes one decode token touches: every dense weight (one row of the token embedding) and
/// the top-k experts of every MoE layer; and the model's total file bytes.
fn touched_bytes(model: &Path) -> Result<(u64, u64)> {
    let file = GgufFile::open(model)?;
    let meta = file.metadata();
    let arch = meta.get_str("general.architecture").unwrap_or("");
    let n_expert = u64::from(meta.get_u32(&format!("{arch}.expert_count")).unwrap_or(0));
    let k = u64::from(
        meta.get_u32(&format!("{arch}.expert_used_count"))
            .unwrap_or(0),
    );
    let mut touched = 0u64;
    for t in file.tensors() {
        let bytes = t.n_bytes.unwrap_or(0);
        if t.name.contains("_exps.") && n_expert > 0 {
            touched += bytes / n_expert * k;
        } else if t.name == "token_embd.weight" {
            touched += bytes / t.dims.get(1).copied().unwrap_or(1).max(1);
        } else {
            touched += bytes;
        }
    }
    let size = file.shards().iter().map(|s| s.bytes().len() as u64).sum();
    Ok((touched, size))
}

/// The first number before `what` in `line`, e.g. "... 12.5 tokens per second".
fn number_before(line: &str, what: &str) -> Option<f64> {
    let head = &line[..line.find(what)?];
    head.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .rfind(|s| !s.is_empty())?
        .parse()
        .ok()
}

/// `read_bytes` of a `/proc/PID/io` file (bytes the process caused to be read from storage).
fn proc_read_bytes(path: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))?
        .trim()
        .parse()
        .ok()
}

/// Bytes read over the last `secs` seconds of `(time, cumulative bytes)` samples (the last
/// sample is the end of the run); `None` without a sample that old.
fn decode_window_reads(samples: &[(Instant, u64)], secs: f64) -> Option<u64> {
    let &(end, total) = samples.last()?;
    let start = end.checked_sub(Duration::from_secs_f64(secs))?;
    // The latest sample at or before the window's start.
    let &(_, before) = samples.iter().rev().find(|(t, _)| *t <= start)?;
    Some(total.saturating_sub(before))
}

/// Runs one engine (its argv) and collects its figures.
fn run_engine(
    engine: &'static str,
    round: usize,
    (argv, env): (&[String], &[(String, String)]),
    cg: Option<&Cgroup>,
    n_predict: usize,
) -> Result<RunResult> {
    let mut cmd = match cg {
        // The shell joins the group, then becomes the engine (same pid for wait4).
        Some(cg) => {
            cg.write("memory.max_usage_in_bytes", "0")?;
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("echo $$ > \"$0/cgroup.procs\" && exec \"$@\"")
                .arg(&cg.dir)
                .args(argv);
            c
        }
        None => {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
    };
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    let t = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", argv[0]))?;
    let mut out = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout pipe"))?;
    let mut err = child
        .stderr
        .take()
        .ok_or_else(|| anyhow!("no stderr pipe"))?;
    let pid = child.id() as libc::pid_t;
    let done = std::sync::atomic::AtomicBool::new(false);
    let (stdout, stderr, status, ru, samples) = std::thread::scope(|s| {
        let done = &done;
        let tty = crate::progress::stderr_is_tty();
        let sampler = s.spawn(move || {
            let mut v: Vec<(Instant, u64)> = Vec::new();
            let path = format!("/proc/{pid}/io");
            let mut shown = t;
            while !done.load(Ordering::Relaxed) {
                if let Some(b) = proc_read_bytes(&path) {
                    v.push((Instant::now(), b));
                }
                // On a terminal, a line that says the run is alive (a peer under a tight cap
                // can take minutes).
                if tty && shown.elapsed() >= Duration::from_millis(500) {
                    shown = Instant::now();
                    let read = v.last().map_or(0, |&(_, b)| b);
                    eprint!(
                        "\r\x1b[2Ksluice bench:   {engine} running, {:.0} s, {:.2} GB read",
                        t.elapsed().as_secs_f64(),
                        read as f64 / 1e9
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if tty {
                eprint!("\r\x1b[2K");
            }
            v
        });
        let o = s.spawn(move || {
            let mut v = Vec::new();
            let _ = out.read_to_end(&mut v);
            v
        });
        let e = s.spawn(move || {
            let mut v = Vec::new();
            let _ = err.read_to_end(&mut v);
            v
        });
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value of this plain C struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `pid` is our child, not yet reaped (std never waits on it here); the status
        // and rusage pointers are valid for writes for the duration of the call.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        let end = Instant::now();
        done.store(true, Ordering::Relaxed);
        let stdout = o.join().unwrap_or_default();
        let stderr = e.join().unwrap_or_default();
        let mut samples = sampler.join().unwrap_or_default();
        // The process's final count is the rusage one (in 512-byte blocks).
        samples.push((end, ru.ru_inblock as u64 * 512));
        (stdout, stderr, (rc == pid).then_some(status), ru, samples)
    });
    let wall_s = t.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&stdout);
    let stderr = String::from_utf8_lossy(&stderr);
    let Some(status) = status else {
        bail!("{engine}: waiting for the run failed");
    };
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        bail!(
            "{engine} failed (wait status {status}; killed by the memory cap if the kernel log \
             says so); last lines of its standard error:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let mut r = RunResult {
        engine,
        round,
        n_gen: n_predict,
        read_bytes: ru.ru_inblock as u64 * 512,
        max_rss_kib: ru.ru_maxrss as u64,
        major_faults: ru.ru_majflt as u64,
        cgroup_peak: cg.and_then(|c| c.read_u64("memory.max_usage_in_bytes")),
        wall_s,
        ..RunResult::default()
    };
    let text = format!("{stdout}\n{stderr}");
    parse_lines(&mut r, &text, n_predict);
    let Some(tps) = r.decode_tps.filter(|&t| t > 0.0) else {
        bail!("{engine}: no decode timing in its output:\n{stderr}");
    };
    r.decode_read_bytes = decode_window_reads(&samples, r.n_gen as f64 / tps);
    Ok(r)
}

/// Reads an engine's figures from its output lines into `r` (by `r.engine`).
fn parse_lines(r: &mut RunResult, text: &str, n_predict: usize) {
    let gen_tokens = |rest: &str| {
        rest.split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(n_predict)
    };
    let mut prefill_s = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("moe-stream: read ") {
            r.stream_mib_tok = number_before(rest, " MiB/token)");
            continue;
        }
        if let Some(rest) = line.strip_prefix("moe-cache: ") {
            r.hit_pct = r.hit_pct.or(number_before(rest, "% hit"));
            continue;
        }
        if r.engine == LLAMA_SHIPPED {
            // llamacpp cpu=... n_prompt=P prefill_s=S prefill_tps=X n_decode=N decode_s=S
            // decode_tps=Y load_s=L (scripts/bench_llamacpp.cpp)
            if let Some(rest) = line.strip_prefix("llamacpp ") {
                let field = |key: &str| {
                    rest.split(' ')
                        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                        .and_then(|v| v.parse::<f64>().ok())
                };
                r.prefill_tps = field("prefill_tps");
                r.decode_tps = field("decode_tps");
                r.n_gen = field("n_decode").map_or(n_predict, |n| n as usize);
                r.load_s = field("load_s");
                prefill_s = field("prefill_s");
            }
            continue;
        }
        if r.engine == "bmoe-cli" {
            if let Some(rest) = line.strip_prefix("generation: ") {
                r.decode_tps = number_before(line, " tok/s)");
                r.n_gen = gen_tokens(rest);
            } else if let Some(rest) = line.strip_prefix("prefill: ") {
                r.prefill_tps = number_before(rest, " tok/s)");
                r.load_s = number_before(rest, " s | TTFT");
                r.ttft_s = rest
                    .split("TTFT ")
                    .nth(1)
                    .and_then(|t| t.trim().trim_end_matches(" s").parse().ok());
            }
            continue;
        }
        if r.engine == "sluice" {
            if let Some(rest) = line.strip_prefix("generation: ") {
                r.decode_tps = number_before(line, " tok/s)");
                r.n_gen = gen_tokens(rest);
            } else if line.contains(", prefill ") {
                r.prefill_tps = number_before(line, " tok/s)");
                prefill_s = line
                    .split(", prefill ")
                    .nth(1)
                    .and_then(|t| t.split(' ').next())
                    .and_then(|t| t.parse::<f64>().ok());
            } else if line.starts_with("sluice: loaded ") {
                r.load_s = line
                    .rsplit(" in ")
                    .next()
                    .and_then(|t| number_before(t, " s"));
            }
        } else if line.contains("prompt eval time") {
            r.prefill_tps = number_before(line, " tokens per second");
        } else if line.contains(" eval time") {
            r.decode_tps = number_before(line, " tokens per second");
            r.n_gen = number_before(line, " runs").map_or(n_predict, |n| n as usize + 1);
        }
    }
    if let (Some(l), Some(p)) = (r.load_s, prefill_s) {
        r.ttft_s = Some(l + p);
    }
}

impl RunResult {
    /// The engine, and the variant's label if any.
    fn name(&self) -> String {
        if self.label.is_empty() {
            self.engine.to_owned()
        } else {
            format!("{} [{}]", self.engine, self.label)
        }
    }
}

/// The CPU as /proc/cpuinfo names it: model name, family/model/stepping and the vector
/// features a kernel choice depends on.
pub(crate) fn cpu_line(cpuinfo: &str) -> String {
    let field = |name: &str| {
        cpuinfo
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    };
    let name = field("model name").unwrap_or_else(|| "unknown CPU".into());
    let ids = match (field("cpu family"), field("model"), field("stepping")) {
        (Some(f), Some(m), Some(st)) => format!(" (family {f}, model {m}, stepping {st})"),
        (Some(f), Some(m), None) => format!(" (family {f}, model {m})"),
        _ => String::new(),
    };
    let flags = field("flags").unwrap_or_default();
    let have: Vec<&str> = flags.split_whitespace().collect();
    let shown: Vec<&str> = [
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "avx_vnni",
        "amx_int8",
    ]
    .into_iter()
    .filter(|f| have.contains(f))
    .collect();
    let flags = if shown.is_empty() {
        String::new()
    } else {
        format!(", flags {}", shown.join(" "))
    };
    format!("{name}{ids}{flags}")
}

fn machine_line() -> String {
    let cpu = cpu_line(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or_else(String::new, |kib| {
            format!(", {:.1} GiB RAM", kib / (1 << 20) as f64)
        });
    format!("{cpu}, {cores} cores available{mem}")
}

/// `path` with the home directory written `~` (reports name no one's home).
fn home_relative(path: &str) -> String {
    match std::env::var("HOME") {
        Ok(home) if !home.is_empty() && home != "/" => match path.strip_prefix(&home) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("~{rest}"),
            _ => path.to_owned(),
        },
        _ => path.to_owned(),
    }
}

/// An argument as a POSIX shell reads it back: quoted when it holds anything but plain
/// characters.
fn shell_quote(a: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%~".contains(c);
    if !a.is_empty() && a.chars().all(plain) {
        a.to_owned()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

fn split_args(s: &Option<String>) -> Vec<String> {
    s.as_deref()
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.digits$}"))
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

pub fn run(args: BenchArgs) -> Result<()> {
    let threads = runtime::load::thread_count(args.threads);
    let model = std::fs::canonicalize(&args.model)
        .with_context(|| format!("cannot find {}", args.model.display()))?;
    let peer_exe = match args.peer {
        Peer::Llama => {
            let dir = tool_path(
                args.llama_bin.as_ref(),
                "SLUICE_LLAMACPP",
                "llama.cpp-0.3.36",
                "build/bin",
            );
            let exe = dir.join("llama-completion");
            if !exe.is_file() {
                bail!(
                    "{} not found: build it with `bash scripts/build_llamacpp.sh` or pass \
                     --llama-bin DIR",
                    exe.display()
                );
            }
            exe
        }
        Peer::Bmoe => {
            let exe = tool_path(
                args.bmoe_bin.as_ref(),
                "SLUICE_BMOE",
                "bmoe-2d4f2b1",
                "src/build/cli/bmoe-cli",
            );
            if !exe.is_file() {
                bail!(
                    "{} not found: build it with `bash scripts/build_bmoe.sh` or pass \
                     --bmoe-bin FILE",
                    exe.display()
                );
            }
            exe
        }
    };
    let peer = args.peer.engine();
    let shipped = if args.with_llama {
        let exe = tool_path(
            args.llama_driver.as_ref(),
            "SLUICE_LLAMACPP_NPM",
            "llamacpp-npm",
            "bench_llamacpp",
        );
        let cpu = exe.with_file_name("cpu");
        if !exe.is_file() || !cpu.is_dir() {
            bail!(
                "{} (or the cpu/ directory beside it) not found: build it with `bash \
                 scripts/build_bench_llamacpp.sh` or pass --llama-driver FILE",
                exe.display()
            );
        }
        Some((exe, cpu))
    } else {
        None
    };
    if args.rounds == 0 || args.n_predict == 0 {
        bail!("--rounds and -n must be at least 1");
    }
    let (touched, model_bytes) = touched_bytes(&model)?;
    let cg = args.mem_cap_mb.map(Cgroup::create).transpose()?;

    let m = model.display().to_string();
    let (n, t, c) = (
        args.n_predict.to_string(),
        threads.to_string(),
        args.ctx.to_string(),
    );
    let me = std::env::current_exe()
        .context("cannot find the sluice executable")?
        .display()
        .to_string();
    // The same flags for all: model, prompt, tokens, greedy, threads, context; no early stop
    // (bmoe-cli has no such flag: it runs to -n unless the model ends the text).
    let mut common: Vec<String> = ["-m", &m, "-p", &args.prompt, "-n", &n, "--temp", "0"]
        .map(str::to_owned)
        .to_vec();
    let tail: Vec<String> = ["-t", &t, "-c", &c].map(str::to_owned).to_vec();
    let mut sluice_argv = vec![me, "run".to_owned()];
    sluice_argv.extend(common.iter().cloned());
    sluice_argv.push("--ignore-eos".to_owned());
    sluice_argv.extend(tail.iter().cloned());
    sluice_argv.extend(split_args(&args.sluice_args));
    let variants = labelled("--variant", &args.variant, &sluice_argv)?;
    let mut peer_argv = vec![peer_exe.display().to_string()];
    match args.peer {
        Peer::Llama => {
            common.push("--ignore-eos".to_owned());
            peer_argv.extend(common);
            peer_argv.extend(tail);
            peer_argv.extend(["-no-cnv", "--no-warmup"].map(str::to_owned));
        }
        Peer::Bmoe => {
            peer_argv.extend(common);
            peer_argv.extend(tail);
        }
    }
    peer_argv.extend(split_args(&args.llama_args));
    let peer_variants = labelled("--peer-variant", &args.peer_variant, &peer_argv)?;
    // llama.cpp as shipped: the driver takes the same model, prompt, tokens, threads and
    // context (greedy and end of generation ignored are its only mode).
    let shipped_run = shipped.as_ref().map(|(exe, cpu)| {
        let mut argv = vec![exe.display().to_string()];
        argv.extend(
            ["-m", &m, "-p", &args.prompt, "-n", &n, "-t", &t, "-c", &c].map(str::to_owned),
        );
        let env = vec![("GGML_BACKEND_DIR".to_owned(), cpu.display().to_string())];
        (String::new(), argv, env)
    });
    let no_env: Vec<(String, String)> = Vec::new();

    eprintln!(
        "sluice bench: calibrating direct-I/O reads of the model file ({} s)",
        args.calib_secs
    );
    let disk = calibrate_disk(&model, args.calib_secs);
    if let Err(e) = &disk {
        eprintln!("sluice bench: no disk calibration: {e:#}");
    }
    eprintln!(
        "sluice bench: calibrating DRAM reads ({} s)",
        args.calib_secs
    );
    let dram = calibrate_dram(threads, args.calib_secs);

    let mut results = Vec::new();
    for round in 1..=args.rounds {
        let runs = round_order(variants.len(), round)
            .into_iter()
            .map(|i| &variants[i])
            .map(|(label, argv)| ("sluice", label.as_str(), argv, &no_env))
            .chain(
                peer_variants
                    .iter()
                    .map(|(label, argv)| (peer, label.as_str(), argv, &no_env)),
            )
            .chain(
                shipped_run
                    .iter()
                    .map(|(label, argv, env)| (LLAMA_SHIPPED, label.as_str(), argv, env)),
            );
        for (engine, label, argv, env) in runs {
            let (left, how) = if args.warm {
                (warm(&model)?, "read through the page cache")
            } else {
                (evict(&model)?, "evicted")
            };
            eprintln!(
                "sluice bench: round {round}/{}: {engine}{} (model {how}, {:.1}% cached)",
                args.rounds,
                if label.is_empty() {
                    String::new()
                } else {
                    format!(" [{label}]")
                },
                left * 100.0
            );
            let mut r = run_engine(engine, round, (argv, env), cg.as_ref(), args.n_predict)?;
            r.label = label.to_owned();
            eprintln!(
                "sluice bench:   decode {} tok/s, prefill {} tok/s, TTFT {} s, read {:.0} MiB, peak RSS {:.0} MiB, {:.1} s",
                fmt_opt(r.decode_tps, 2),
                fmt_opt(r.prefill_tps, 2),
                fmt_opt(r.ttft_s, 1),
                r.read_bytes as f64 / (1 << 20) as f64,
                r.max_rss_kib as f64 / 1024.0,
                r.wall_s
            );
            results.push(r);
        }
    }

    // The report.
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let mut md = String::new();
    let title = args.label.clone().unwrap_or_else(|| {
        format!(
            "{} ({} tokens, {} threads{})",
            model
                .file_name()
                .map_or_else(|| m.clone(), |f| f.to_string_lossy().into_owned()),
            args.n_predict,
            threads,
            args.mem_cap_mb
                .map_or(String::new(), |c| format!(", {c} MiB cap"))
        )
    });
    md += &format!("\n## {title}\n\n");
    let argv: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| shell_quote(&home_relative(&a)))
        .collect();
    md += &format!("Command: `sluice {}`\n\n", argv.join(" "));
    md += &format!(
        "- Version: sluice {} vs {} (`{}`){}.\n",
        env!("CARGO_PKG_VERSION"),
        match args.peer {
            Peer::Llama => "llama.cpp 0.5.0-dev `llama-completion` (the llama-cpp-python 0.3.36 tree)",
            Peer::Bmoe => "BigMoeOnEdge `bmoe-cli` (0.19.0 on llama.cpp v0.4.0)",
        },
        home_relative(&peer_exe.display().to_string()),
        shipped.as_ref().map_or_else(String::new, |(exe, _)| format!(
            " and {LLAMA_SHIPPED} as shipped (node-llama-cpp 3.21.1's prebuilt libraries, default \
             settings: memory map, weights repacked, the best CPU library; `{}`)",
            home_relative(&exe.display().to_string())
        ))
    );
    md += &format!("- Machine: {}.\n", machine_line());
    md += &format!(
        "- Model: {} ({:.2} GiB); one decode token touches {:.0} MiB (dense weights, one \
         embedding row, top-k experts of every layer).\n",
        model
            .file_name()
            .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
        model_bytes as f64 / (1u64 << 30) as f64,
        mib(touched as f64)
    );
    md += &format!(
        "- Memory cap: {}. Each run starts with the model file {}; order: every sluice variant \
         (their order turned by one each round), then every {peer} variant{}, in every round.\n",
        args.mem_cap_mb.map_or_else(
            || "none".to_owned(),
            |c| format!("{c} MiB (cgroup v1 memory.limit_in_bytes, page cache included)")
        ),
        if args.warm {
            "read through the page cache (warm: the load reads no disk)"
        } else {
            "evicted from the page cache (posix_fadvise DONTNEED)"
        },
        if shipped.is_some() {
            format!(", then {LLAMA_SHIPPED}")
        } else {
            String::new()
        }
    );
    match &disk {
        Ok((mbs, p50, p99)) => {
            md += &format!(
                "- Calibration (same invocation): direct-I/O 1 MiB random reads of the model \
                 file at queue depth 16: **{mbs:.0} MB/s** (p50 {p50:.1} ms, p99 {p99:.1} ms); \
                 DRAM reads ({threads} threads, 1 GiB): **{dram:.1} GB/s**.\n"
            )
        }
        Err(e) => {
            md += &format!(
                "- Calibration: no direct-I/O figure ({e}); DRAM reads ({threads} threads, \
                 1 GiB): **{dram:.1} GB/s**.\n"
            )
        }
    }
    let mut refs = vec![peer];
    if shipped.is_some() {
        refs.push(LLAMA_SHIPPED);
    }
    md += "\n| round | engine | prefill tok/s | decode tok/s | ";
    for e in &refs {
        md += &format!("decode ratio sluice / {e} | ");
    }
    md += "load s | TTFT s | engine MiB / token | decode read MiB / token | run read MiB | major \
         faults | hit % | peak RSS MiB | bound tok/s | of bound |\n|";
    md += &" --- |".repeat(14 + refs.len());
    md += "\n";
    let disk_mbs = disk.as_ref().ok().map(|d| d.0);
    let bound = |r: &RunResult| bound_tps(r, disk_mbs, dram, touched);
    let distrust = untrusted(&results, disk_mbs, bound);
    for r in &results {
        let ratio = |e: &str| {
            let other = results.iter().find(|o| o.round == r.round && o.engine == e);
            match (r.engine, r.decode_tps, other.and_then(|o| o.decode_tps)) {
                ("sluice", Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            }
        };
        let ratios: String = refs
            .iter()
            .map(|e| format!(" {} |", fmt_opt(ratio(e), 2)))
            .collect();
        let per_token = r
            .decode_read_bytes
            .map(|b| b as f64 / r.n_gen.max(1) as f64);
        let bound = bound(r);
        let rss = match r.cgroup_peak {
            Some(p) => format!(
                "{:.0} (group {:.0})",
                r.max_rss_kib as f64 / 1024.0,
                mib(p as f64)
            ),
            None => format!("{:.0}", r.max_rss_kib as f64 / 1024.0),
        };
        md += &format!(
            "| {} | {} | {} | {} |{ratios} {} | {} | {} | {} | {:.0} | {} | {} | {} | {:.2} | {} |\n",
            r.round,
            r.name(),
            fmt_opt(r.prefill_tps, 2),
            fmt_opt(r.decode_tps, 2),
            fmt_opt(r.load_s, 2),
            fmt_opt(r.ttft_s, 2),
            fmt_opt(r.stream_mib_tok, 1),
            fmt_opt(per_token.map(mib), 1),
            mib(r.read_bytes as f64),
            r.major_faults,
            fmt_opt(r.hit_pct, 1),
            rss,
            bound,
            r.decode_tps.map_or_else(
                || "–".into(),
                |d| {
                    let share = 100.0 * d / bound;
                    if share > 100.0 {
                        format!("{share:.0}% (!)")
                    } else {
                        format!("{share:.0}%")
                    }
                }
            ),
        );
    }
    let mut medians = Vec::new();
    for e in &refs {
        medians.extend(median_ratios(&results, e));
    }
    md += &format!(
        "\nMedian decode ratio over {} rounds: {}. Load s and TTFT s (load + prefill): \
         the engines' own lines; engine MiB / token: expert bytes read per generated token \
         by the streaming engine's count (its `moe-stream:` line). Decode read MiB / \
         token: the block-layer reads (`/proc/PID/io`, sampled every 20 ms) of the run's last \
         n ÷ decode-tok/s seconds, over the n generated tokens; run read MiB: the whole run's \
         (load and prefill included). Bound: min(disk ÷ decode read bytes per token, DRAM ÷ \
         bytes touched per token); \"of bound\" is the decode rate's share of it.\n",
        args.rounds,
        medians.join("; ")
    );
    if !distrust.is_empty() {
        md += &format!(
            "\n**The calibration is not to be trusted for these runs**, so neither are the bound \
             and \"of bound\" columns (marked (!) where above 100 %): {}.\n",
            distrust.join("; ")
        );
        for d in &distrust {
            eprintln!("sluice bench: warning: calibration not trusted: {d}");
        }
    }
    if let Some(png) = &args.png {
        let font = crate::plot::load_font(args.font.as_deref())?;
        draw_png(png, &results, font)?;
        let rel = match (&args.append, png.parent()) {
            (Some(a), Some(_)) => a
                .parent()
                .and_then(|d| png.strip_prefix(d).ok())
                .map_or_else(|| png.display().to_string(), |p| p.display().to_string()),
            _ => png.display().to_string(),
        };
        md += &format!("\n![decode tok/s per run]({rel})\n");
    }
    print!("{md}");
    if let Some(path) = &args.append {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        f.write_all(md.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Where a side-by-side tool is: the flag's path if given, else `rel` under the directory the
/// environment variable `env` names, else under `~/.cache/sluice/<cache_dir>` (where the
/// scripts that build the tools put them).
fn tool_path(flag: Option<&PathBuf>, env: &str, cache_dir: &str, rel: &str) -> PathBuf {
    if let Some(p) = flag {
        return p.clone();
    }
    std::env::var_os(env)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/sluice")
                .join(cache_dir)
        })
        .join(rel)
}

/// A run's physical bound in tokens per second: min(disk ÷ its decode read bytes per token,
/// DRAM ÷ the bytes one token touches); DRAM's alone without a disk figure or decode reads.
fn bound_tps(r: &RunResult, disk_mbs: Option<f64>, dram_gbs: f64, touched: u64) -> f64 {
    let dram_bound = dram_gbs * 1e9 / touched.max(1) as f64;
    let per_token = r
        .decode_read_bytes
        .map(|b| b as f64 / r.n_gen.max(1) as f64);
    match (disk_mbs, per_token) {
        (Some(mbs), Some(p)) if p > 0.0 => dram_bound.min(mbs * 1e6 / p),
        _ => dram_bound,
    }
}

/// Why the calibration cannot be trusted for these runs (empty when it can): a run whose
/// decode read the disk faster than the calibrated direct-I/O rate (the calibration then
/// measured a slower disk than the engines met), and a run faster than its bound (a bound is
/// a physical limit; a share above 100 % means one of its inputs is wrong).
fn untrusted(
    results: &[RunResult],
    disk_mbs: Option<f64>,
    bound: impl Fn(&RunResult) -> f64,
) -> Vec<String> {
    let mut out = Vec::new();
    for r in results {
        let Some(tps) = r.decode_tps.filter(|&t| t > 0.0) else {
            continue;
        };
        if let (Some(mbs), Some(b)) = (disk_mbs, r.decode_read_bytes) {
            let rate = b as f64 / (r.n_gen.max(1) as f64 / tps) / 1e6;
            if rate > mbs {
                out.push(format!(
                    "round {} {} read {rate:.0} MB/s during its decode, faster than the \
                     calibrated {mbs:.0} MB/s",
                    r.round,
                    r.name()
                ));
            }
        }
        let b = bound(r);
        if tps > b {
            out.push(format!(
                "round {} {} decoded at {:.0} % of its bound ({tps:.2} of {b:.2} tok/s)",
                r.round,
                r.name(),
                100.0 * tps / b
            ));
        }
    }
    out
}

/// `LABEL=ARGS` configurations of `flag` appended to `base`; one unlabelled one when none is
/// given.
fn labelled(flag: &str, specs: &[String], base: &[String]) -> Result<Vec<(String, Vec<String>)>> {
    let mut out = Vec::new();
    for v in specs {
        let Some((label, extra)) = v.split_once('=') else {
            bail!("{flag} {v:?}: expected LABEL=ARGS");
        };
        if label.is_empty() {
            bail!("{flag} {v:?}: the label is empty");
        }
        let mut argv = base.to_vec();
        argv.extend(split_args(&Some(extra.to_owned())));
        out.push((label.to_owned(), argv));
    }
    if out.is_empty() {
        out.push((String::new(), base.to_vec()));
    }
    Ok(out)
}

/// The order of `n` variants in round `round` (from 1): turned left by `round - 1`.
fn round_order(n: usize, round: usize) -> Vec<usize> {
    (0..n).map(|i| (i + round.saturating_sub(1)) % n).collect()
}

/// For every sluice variant and every peer variant, the median over the rounds of the
/// decode ratio of the two runs of the same round, as report text.
fn median_ratios(results: &[RunResult], peer: &str) -> Vec<String> {
    let labels = |engine: &str| {
        let mut v: Vec<&str> = Vec::new();
        for r in results.iter().filter(|r| r.engine == engine) {
            if !v.contains(&r.label.as_str()) {
                v.push(&r.label);
            }
        }
        v
    };
    let (ours, theirs) = (labels("sluice"), labels(peer));
    let name = |engine: &str, label: &str| {
        if label.is_empty() {
            engine.to_owned()
        } else {
            format!("{engine} [{label}]")
        }
    };
    let mut out = Vec::new();
    for a in &ours {
        for b in &theirs {
            let v: Vec<f64> = results
                .iter()
                .filter(|r| r.engine == "sluice" && r.label == *a)
                .filter_map(|r| {
                    let o = results
                        .iter()
                        .find(|o| o.engine == peer && o.label == *b && o.round == r.round)?;
                    let (x, y) = (r.decode_tps?, o.decode_tps?);
                    (y > 0.0).then_some(x / y)
                })
                .collect();
            out.push(format!(
                "{} / {} **{}**",
                name("sluice", a),
                name(peer, b),
                fmt_opt(median(v), 2)
            ));
        }
    }
    out
}

fn draw_png(path: &Path, results: &[RunResult], font: &'static [u8]) -> Result<()> {
    use plotters::prelude::*;
    let max = results
        .iter()
        .filter_map(|r| r.decode_tps)
        .fold(0f64, f64::max)
        .max(1e-3);
    let root = crate::plot::canvas(path, (960, 540), font)?;
    let n = results.len();
    let mut chart = ChartBuilder::on(&root)
        .caption("Decode tok/s per run (A B A B)", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..n as f64, 0.0..max * 1.15)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("decode tok/s")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()?;
    let color = |e: &str| {
        crate::plot::COLORS[match e {
            "sluice" => 0,
            LLAMA_SHIPPED => 2,
            _ => 1,
        }]
    };
    chart.draw_series(results.iter().enumerate().filter_map(|(i, r)| {
        let v = r.decode_tps?;
        Some(Rectangle::new(
            [(i as f64 + 0.15, 0.0), (i as f64 + 0.85, v)],
            color(r.engine).filled(),
        ))
    }))?;
    // The value above each bar, and its engine and round under the axis.
    chart.draw_series(results.iter().enumerate().filter_map(|(i, r)| {
        let v = r.decode_tps?;
        Some(Text::new(
            format!("{v:.2}"),
            (i as f64 + 0.4, v + max * 0.05),
            ("sans-serif", 16),
        ))
    }))?;
    // Under each bar: the engine, the variant's label (if any) and the round, one per line,
    // centred (about 7 px per character at this size).
    for (i, r) in results.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        let mut lines = vec![r.engine.to_owned()];
        if !r.label.is_empty() {
            lines.push(r.label.clone());
        }
        lines.push(format!("#{}", r.round));
        for (j, line) in lines.iter().enumerate() {
            let w = 7 * line.chars().count() as i32;
            root.draw(&Text::new(
                line.clone(),
                (x - w / 2, y + 8 + 15 * j as i32),
                ("sans-serif", 13),
            ))?;
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_numbers_are_read_from_both_engines_lines() {
        let l = "common_perf_print:        eval time =    4500.00 ms /    31 runs   (  145.16 ms per token,     6.89 tokens per second)";
        assert_eq!(number_before(l, " tokens per second"), Some(6.89));
        assert_eq!(number_before(l, " runs"), Some(31.0));
        let p = "sluice: prompt 9 tokens, prefill 1.100 s (8.18 tok/s)";
        assert_eq!(number_before(p, " tok/s)"), Some(8.18));
        assert_eq!(number_before("no numbers", "x"), None);
    }

    /// The lines the two streaming engines print, copied from runs on the 18.56 GB
    /// Qwen3-30B-A3B-shaped file (`sluice gen-model --like qwen3-30b-a3b --quant Q4_K_M`):
    /// bmoe-cli 0.19.0 `--moe-stream --cache-mb 4000`, and `sluice run --moe-stream on
    /// --cache-mb 1500` (its path shortened).
    #[test]
    fn figures_are_read_from_bmoe_and_sluice_summaries() {
        let bmoe = "generation: 16 tokens, 1.305 s/token (0.766 tok/s)\n\
            prefill: 9 tokens, 12.313 s (0.7 tok/s) | model load 6.752 s | TTFT 19.066 s\n\
            moe-stream: read 1049.6 MiB (65.60 MiB/token), decode 1.305 s/token (compute 1.180 + cache mgmt 0.001 + flash I/O 0.125 s/token, 525 MiB/s)\n\
            moe-cache: 79.3% hit, resident 3999.6 MiB\n\
            moe-cache: 33 evictions, 0 re-reads (0.0/token) — bytes the cache had already paid for once\n";
        let mut r = RunResult {
            engine: "bmoe-cli",
            ..RunResult::default()
        };
        parse_lines(&mut r, bmoe, 64);
        assert_eq!(r.decode_tps, Some(0.766));
        assert_eq!(r.n_gen, 16);
        assert_eq!(r.prefill_tps, Some(0.7));
        assert_eq!(r.load_s, Some(6.752));
        assert_eq!(r.ttft_s, Some(19.066));
        assert_eq!(r.stream_mib_tok, Some(65.60));
        assert_eq!(r.hit_pct, Some(79.3));

        let ours = "sluice: loaded /m.gguf (17.28 GiB, experts streamed) in 1.114 s\n\
            sluice: prompt 1 tokens (1 new), prefill 1.715 s (0.58 tok/s)\n\
            generation: 2 tokens, 0.646 s/token (1.55 tok/s)\n\
            moe-stream: read 842.6 MiB (421.3 MiB/token), decode 0.646 s/token (compute 0.206 + cache mgmt 0.041 + flash I/O 0.399 s/token, 1057 MiB/s)\n\
            moe-cache: 60.0% hit, resident 1498.7 MiB\n";
        let mut r = RunResult {
            engine: "sluice",
            ..RunResult::default()
        };
        parse_lines(&mut r, ours, 32);
        assert_eq!(r.decode_tps, Some(1.55));
        assert_eq!(r.n_gen, 2);
        assert_eq!(r.prefill_tps, Some(0.58));
        assert_eq!(r.load_s, Some(1.114));
        let ttft = r.ttft_s.unwrap_or(0.0);
        assert!((ttft - 2.829).abs() < 1e-9, "{ttft}");
        assert_eq!(r.stream_mib_tok, Some(421.3));
        assert_eq!(r.hit_pct, Some(60.0));
    }

    /// The line scripts/bench_llamacpp.cpp printed for llama.cpp v0.4.0 (npm's libraries) on the
    /// 18.56 GB Qwen3-30B-A3B-shaped file, its CPU features shortened.
    #[test]
    fn figures_are_read_from_the_llama_driver_line() {
        let line = "load_tensors:   CPU_REPACK model buffer size = 13432.50 MiB\n\
            llamacpp cpu=AVX2,FMA,AVX512,REPACK threads=2 n_prompt=9 prefill_s=3.798068 \
            prefill_tps=2.370 n_decode=32 decode_s=7.042495 decode_tps=4.544 load_s=27.840739\n";
        let mut r = RunResult {
            engine: LLAMA_SHIPPED,
            ..RunResult::default()
        };
        parse_lines(&mut r, line, 64);
        assert_eq!(r.decode_tps, Some(4.544));
        assert_eq!(r.prefill_tps, Some(2.370));
        assert_eq!(r.n_gen, 32);
        assert_eq!(r.load_s, Some(27.840739));
        let ttft = r.ttft_s.unwrap_or(0.0);
        assert!((ttft - 31.638807).abs() < 1e-9, "{ttft}");
        // a line of another engine is not taken for it
        let mut r = RunResult {
            engine: "bmoe-cli",
            ..RunResult::default()
        };
        parse_lines(&mut r, line, 64);
        assert_eq!(r.decode_tps, None);
    }

    #[test]
    fn a_calibration_slower_than_the_engines_reads_or_a_share_above_the_bound_is_flagged() {
        let run = |round: usize, tps: f64, read: u64| RunResult {
            engine: "sluice",
            round,
            n_gen: 10,
            decode_tps: Some(tps),
            decode_read_bytes: Some(read),
            ..RunResult::default()
        };
        // 10 tokens at 5 tok/s = 2 s; 400 MB in 2 s = 200 MB/s
        let results = [run(1, 5.0, 400_000_000), run(2, 5.0, 100_000_000)];
        let flags = untrusted(&results, Some(150.0), |_| 10.0);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(
            flags[0].contains("round 1 sluice read 200 MB/s"),
            "{flags:?}"
        );
        assert!(untrusted(&results, Some(250.0), |_| 10.0).is_empty());
        // a decode faster than its bound
        let flags = untrusted(&results, None, |r| if r.round == 2 { 4.0 } else { 6.0 });
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(
            flags[0].contains("round 2 sluice decoded at 125 %"),
            "{flags:?}"
        );
        // the bound: disk ÷ reads per token against DRAM ÷ touched bytes
        let r = run(1, 5.0, 400_000_000);
        assert_eq!(bound_tps(&r, Some(200.0), 10.0, 1_000_000_000), 5.0);
        assert_eq!(bound_tps(&r, Some(2000.0), 10.0, 1_000_000_000), 10.0);
        assert_eq!(bound_tps(&r, None, 10.0, 1_000_000_000), 10.0);
    }

    #[test]
    fn the_cpu_line_names_model_family_and_vector_features() {
        let info = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\n\
            model\t\t: 1\nmodel name\t: AMD EPYC 7551 32-Core Processor\nstepping\t: 2\n\
            flags\t\t: fpu sse2 avx f16c fma avx2 bmi2\n\nprocessor\t: 1\nmodel\t\t: 9\n";
        assert_eq!(
            cpu_line(info),
            "AMD EPYC 7551 32-Core Processor (family 23, model 1, stepping 2), flags avx2 fma f16c"
        );
        assert_eq!(cpu_line(""), "unknown CPU");
    }

    #[test]
    fn ratios_pair_every_sluice_variant_with_every_peer_variant_per_round() {
        let run = |engine: &'static str, label: &str, round: usize, tps: f64| RunResult {
            engine,
            label: label.to_owned(),
            round,
            decode_tps: Some(tps),
            ..RunResult::default()
        };
        let results = [
            run("sluice", "", 1, 6.0),
            run("bmoe-cli", "serial", 1, 3.0),
            run("bmoe-cli", "overlap", 1, 4.0),
            run("sluice", "", 2, 8.0),
            run("bmoe-cli", "serial", 2, 2.0),
            run("bmoe-cli", "overlap", 2, 4.0),
        ];
        assert_eq!(
            median_ratios(&results, "bmoe-cli"),
            [
                "sluice / bmoe-cli [serial] **3.00**",
                "sluice / bmoe-cli [overlap] **1.75**"
            ]
        );
    }

    #[test]
    fn decode_reads_are_the_growth_over_the_last_window() {
        let t0 = Instant::now();
        let at = |ms: u64, b: u64| (t0 + Duration::from_millis(ms), b);
        let s = [at(0, 0), at(100, 500), at(200, 900), at(300, 1000)];
        // last 150 ms: from the sample at 100 ms (the latest before 150 ms) to the end
        assert_eq!(decode_window_reads(&s, 0.15), Some(500));
        assert_eq!(decode_window_reads(&s, 0.3), Some(1000));
        assert_eq!(decode_window_reads(&s, 0.5), None);
        assert_eq!(decode_window_reads(&[], 0.1), None);
    }

    #[test]
    fn arguments_are_quoted_for_the_shell() {
        assert_eq!(shell_quote("--rounds"), "--rounds");
    }

    #[test]
    fn each_round_turns_the_variants_by_one() {
        assert_eq!(round_order(3, 1), [0, 1, 2]);
        assert_eq!(round_order(3, 2), [1, 2, 0]);
        assert_eq!(round_order(3, 3), [2, 0, 1]);
        assert_eq!(round_order(3, 4), [0, 1, 2]);
        assert_eq!(round_order(1, 5), [0]);
        assert!(round_order(0, 2).is_empty());
        assert_eq!(shell_quote("/a/b.gguf"), "/a/b.gguf");
        assert_eq!(shell_quote("two words"), "'two words'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn eviction_empties_the_page_cache_share_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let f = File::open(&path).unwrap();
        f.sync_all().unwrap();
        let mut buf = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut buf).unwrap();
        assert!(cached_share(&f).unwrap() > 0.9);
        assert!(evict(&path).unwrap() < 0.1);
        // and warming reads it back in
        assert!(warm(&path).unwrap() > 0.9);
    }
}
