//! I/O lanes: persistent threads that fill cache slots from the model files.
//!
//! A lane owns its own descriptors (opened with O_DIRECT when the probe allowed it), takes read
//! jobs from a shared queue — demand reads always before speculative ones — reads each job's
//! windows straight into its slot and reports the job back on a channel, in completion order.
//! Two backends: [`Backend::Pread`] runs one thread per lane, each doing blocking `pread`s
//! (portable, the default); [`Backend::Uring`] runs one thread that keeps up to `lanes` jobs in
//! flight on an io_uring (Linux only, where the kernel and its seccomp policy allow it: see
//! [`uring_available`]).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::StoreError;
use crate::cache::AlignedBuf;
use crate::layout::ExpertLayout;
use crate::read::{ExpertReader, IoMode, ReadFault, WindowRead};

/// How the lanes issue reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// One thread per lane, blocking `pread`s.
    Pread,
    /// One thread, up to `lanes` jobs in flight on an io_uring.
    Uring,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Pread => "pread",
            Backend::Uring => "io_uring",
        }
    }
}

/// One expert to read into `buf`.
#[derive(Debug)]
pub struct ReadJob {
    pub layer: u32,
    pub expert: u32,
    /// The slot (of [`ExpertReader::slot_bytes`]), lent by the cache.
    pub buf: AlignedBuf,
    /// A read the computation waits for (else a speculative one, served after every demand
    /// read queued).
    pub demand: bool,
}

/// A finished job.
#[derive(Debug)]
pub struct ReadDone {
    pub layer: u32,
    pub expert: u32,
    pub buf: AlignedBuf,
    pub demand: bool,
    /// Bytes read (whole aligned windows), or why the read failed.
    pub result: Result<u64, StoreError>,
    /// Time the lane spent on the job.
    pub busy: Duration,
    /// The lane that read it.
    pub lane: usize,
    /// Each window's read (when the lanes record them: [`IoLanes::record_windows`]).
    pub windows: Vec<WindowRead>,
}

#[derive(Default)]
struct Queue {
    demand: VecDeque<ReadJob>,
    spec: VecDeque<ReadJob>,
    shutdown: bool,
}

impl Queue {
    fn pop(&mut self) -> Option<ReadJob> {
        self.demand.pop_front().or_else(|| self.spec.pop_front())
    }
}

#[derive(Default)]
struct Shared {
    q: Mutex<Queue>,
    cv: Condvar,
    /// Record each window's read in [`ReadDone::windows`].
    record: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn recording(&self) -> bool {
        self.record.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Shared {
    /// The next job, waiting for one (`None`: shut down).
    fn next(&self) -> Option<ReadJob> {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(job) = q.pop() {
                return Some(job);
            }
            if q.shutdown {
                return None;
            }
            q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The next job if one is queued.
    fn try_next(&self) -> Option<ReadJob> {
        self.q.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }
}

/// The lanes; see the [module docs](self).
pub struct IoLanes {
    shared: Arc<Shared>,
    rx: Receiver<ReadDone>,
    threads: Vec<JoinHandle<()>>,
    direct: bool,
    backend: Backend,
    lanes: usize,
    in_flight: usize,
}

impl IoLanes {
    /// Start `lanes` lanes on the files `paths` of `layout`. With [`IoMode::Auto`], O_DIRECT
    /// is probed once and used by every lane where it works.
    pub fn start(
        paths: &[PathBuf],
        layout: &ExpertLayout,
        mode: IoMode,
        lanes: usize,
        backend: Backend,
        fault: Option<ReadFault>,
    ) -> Result<IoLanes, StoreError> {
        let lanes = lanes.max(1);
        let probe = ExpertReader::open(paths, layout, mode)?;
        let direct = probe.direct();
        let shared = Arc::new(Shared::default());
        let (tx, rx) = channel();
        // Built first, so that a lane failing to start shuts the started ones down (Drop).
        let mut io = IoLanes {
            shared: Arc::clone(&shared),
            rx,
            threads: Vec::new(),
            direct,
            backend,
            lanes,
            in_flight: 0,
        };
        let readers = match backend {
            Backend::Pread => lanes,
            Backend::Uring => 1,
        };
        // The most windows one job reads (the most parts of a layer's experts).
        let max_windows = layout
            .layers
            .iter()
            .map(|l| l.parts.len())
            .max()
            .unwrap_or(1)
            .max(1);
        for i in 0..readers {
            // Each lane its own descriptors.
            let mut reader = ExpertReader::open_as(paths, layout, direct)?;
            reader.inject_fault(fault);
            let shared = Arc::clone(&shared);
            let tx = tx.clone();
            let spawned = match backend {
                Backend::Pread => std::thread::Builder::new()
                    .name(format!("sluice-io-{i}"))
                    .spawn(move || pread_lane(i, &reader, &shared, &tx)),
                Backend::Uring => {
                    #[cfg(target_os = "linux")]
                    {
                        let ring = uring::Ring::new(lanes, max_windows)?;
                        std::thread::Builder::new()
                            .name("sluice-io-uring".into())
                            .spawn(move || ring.run(&reader, &shared, &tx))
                    }
                    #[cfg(not(target_os = "linux"))]
                    {
                        let _ = max_windows;
                        return Err(StoreError::Lanes {
                            msg: "io_uring exists only on Linux".into(),
                        });
                    }
                }
            };
            let handle = spawned.map_err(|e| StoreError::Lanes {
                msg: format!("cannot start an I/O lane: {e}"),
            })?;
            io.threads.push(handle);
        }
        Ok(io)
    }

    /// Whether the reads bypass the page cache.
    pub fn direct(&self) -> bool {
        self.direct
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Reads in flight at once at most.
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Jobs submitted and not yet taken back.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Record each window's read (offset, bytes, latency) in the finished jobs, for an I/O
    /// trace.
    pub fn record_windows(&self, on: bool) {
        self.shared
            .record
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Queue `job`.
    pub fn submit(&mut self, job: ReadJob) {
        let mut q = self.shared.q.lock().unwrap_or_else(|p| p.into_inner());
        if job.demand {
            q.demand.push_back(job);
        } else {
            q.spec.push_back(job);
        }
        drop(q);
        self.in_flight += 1;
        self.shared.cv.notify_one();
    }

    /// The next finished job, waiting for one; `None` when nothing is in flight.
    pub fn wait(&mut self) -> Option<ReadDone> {
        if self.in_flight == 0 {
            return None;
        }
        let done = self.rx.recv().ok()?;
        self.in_flight -= 1;
        Some(done)
    }

    /// A finished job if one is there.
    pub fn poll(&mut self) -> Option<ReadDone> {
        if self.in_flight == 0 {
            return None;
        }
        match self.rx.try_recv() {
            Ok(done) => {
                self.in_flight -= 1;
                Some(done)
            }
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => None,
        }
    }
}

impl Drop for IoLanes {
    fn drop(&mut self) {
        let mut q = self.shared.q.lock().unwrap_or_else(|p| p.into_inner());
        // Queued reads are not made: nobody will take them.
        q.demand.clear();
        q.spec.clear();
        q.shutdown = true;
        drop(q);
        self.shared.cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn pread_lane(lane: usize, reader: &ExpertReader, shared: &Shared, tx: &Sender<ReadDone>) {
    while let Some(mut job) = shared.next() {
        let t = Instant::now();
        let mut windows = Vec::new();
        let timings = shared.recording().then_some(&mut windows);
        let result = reader.read_timed(job.layer, job.expert, job.buf.as_mut_slice(), timings);
        let done = ReadDone {
            layer: job.layer,
            expert: job.expert,
            buf: job.buf,
            demand: job.demand,
            result,
            busy: t.elapsed(),
            lane,
            windows,
        };
        if tx.send(done).is_err() {
            return;
        }
    }
}

/// Whether an io_uring can be set up here (always `false` off Linux, and on Android, whose
/// seccomp policy kills a process that tries).
pub fn uring_available() -> bool {
    #[cfg(target_os = "linux")]
    {
        uring::probe()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[cfg(target_os = "linux")]
mod uring {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    use std::sync::mpsc::Sender;
    use std::time::Instant;

    use io_uring::{IoUring, opcode, types};

    use super::{ReadDone, ReadJob, Shared};
    use crate::StoreError;
    use crate::cache::AlignedBuf;
    use crate::read::{ExpertReader, Window};

    pub fn probe() -> bool {
        let Ok(mut ring) = IoUring::new(2) else {
            return false;
        };
        let nop = opcode::Nop::new().build().user_data(7);
        // SAFETY: a no-op references no memory.
        if unsafe { ring.submission().push(&nop) }.is_err() {
            return false;
        }
        if ring.submit_and_wait(1).is_err() {
            return false;
        }
        ring.completion()
            .next()
            .is_some_and(|c| c.user_data() == 7 && c.result() == 0)
    }

    pub struct Ring {
        ring: IoUring,
        /// Jobs in flight at most, so that their windows always fit the submission queue.
        depth: usize,
    }

    /// A job in flight: its windows and what came back of each (and when).
    struct Active {
        job: ReadJob,
        windows: Vec<Window>,
        got: Vec<Option<Result<usize, i32>>>,
        done_ns: Vec<u64>,
        left: usize,
        t0: Instant,
    }

    const WINDOW_BITS: u32 = 8;

    impl Ring {
        /// A ring for `depth` jobs of at most `max_windows` windows each.
        pub fn new(depth: usize, max_windows: usize) -> Result<Ring, StoreError> {
            let want = depth.max(1) * max_windows.max(1);
            let entries = want.next_power_of_two().clamp(8, 4096);
            let ring = IoUring::new(entries as u32).map_err(|e| StoreError::Lanes {
                msg: format!("io_uring setup refused: {e}"),
            })?;
            let depth = depth.max(1).min((entries / max_windows.max(1)).max(1));
            Ok(Ring { ring, depth })
        }

        pub fn run(mut self, reader: &ExpertReader, shared: &Shared, tx: &Sender<ReadDone>) {
            let depth = self.depth;
            let mut slab: Vec<Option<Active>> = Vec::new();
            let mut active = 0usize;
            let mut receiver_gone = false;
            loop {
                // Take jobs while there is room; wait for one only when nothing is in flight.
                while active < depth {
                    let job = if active == 0 {
                        match shared.next() {
                            Some(j) => j,
                            None => return,
                        }
                    } else {
                        match shared.try_next() {
                            Some(j) => j,
                            None => break,
                        }
                    };
                    match self.issue(reader, job, &mut slab) {
                        Ok(()) => active += 1,
                        Err(done) => {
                            receiver_gone |= tx.send(*done).is_err();
                        }
                    }
                }
                if active == 0 {
                    if receiver_gone {
                        return;
                    }
                    continue;
                }
                if let Err(e) = self.ring.submit_and_wait(1)
                    && e.kind() != std::io::ErrorKind::Interrupted
                {
                    // The ring broke: fail every job in flight. The kernel may still write
                    // into their buffers, so those are leaked, never reused. Every later job
                    // is read with pread on this thread.
                    for a in slab.iter_mut().filter_map(Option::take) {
                        let err = reader.read_error(
                            a.job.layer,
                            a.job.expert,
                            &a.windows[0],
                            format!("io_uring: {e}"),
                        );
                        let mut a = a;
                        std::mem::forget(std::mem::replace(&mut a.job.buf, AlignedBuf::new(0)));
                        let _ = tx.send(finish(a, Err(err)));
                    }
                    while let Some(mut job) = shared.next() {
                        let t0 = Instant::now();
                        let result = reader.read(job.layer, job.expert, job.buf.as_mut_slice());
                        if tx.send(done_of(job, result, t0)).is_err() {
                            return;
                        }
                    }
                    return;
                }
                let cqes: Vec<(u64, i32)> = self
                    .ring
                    .completion()
                    .map(|c| (c.user_data(), c.result()))
                    .collect();
                for (ud, res) in cqes {
                    let (idx, wi) = ((ud >> WINDOW_BITS) as usize, (ud & 0xff) as usize);
                    let Some(Some(a)) = slab.get_mut(idx) else {
                        continue;
                    };
                    a.got[wi] = Some(if res < 0 { Err(-res) } else { Ok(res as usize) });
                    a.done_ns[wi] = a.t0.elapsed().as_nanos() as u64;
                    a.left -= 1;
                    if a.left == 0
                        && let Some(mut a) = slab[idx].take()
                    {
                        active -= 1;
                        let result = complete(reader, &a).or_else(|_| retry_sync(reader, &mut a));
                        let timings = if shared.recording() {
                            a.windows
                                .iter()
                                .zip(&a.done_ns)
                                .map(|(w, &ns)| w.timing(ns))
                                .collect()
                        } else {
                            Vec::new()
                        };
                        let mut done = finish(a, result);
                        done.windows = timings;
                        receiver_gone |= tx.send(done).is_err();
                    }
                }
            }
        }

        /// Queue `job`'s windows; a job that cannot be queued comes back finished (failed).
        fn issue(
            &mut self,
            reader: &ExpertReader,
            mut job: ReadJob,
            slab: &mut Vec<Option<Active>>,
        ) -> Result<(), Box<ReadDone>> {
            let t0 = Instant::now();
            let windows = match reader.windows(job.layer, job.expert) {
                Ok(w) => w,
                Err(e) => return Err(Box::new(done_of(job, Err(e), t0))),
            };
            let injected = reader
                .fault()
                .is_some_and(|f| f.layer == job.layer && f.expert == job.expert);
            let too_big = windows
                .iter()
                .any(|w| w.slot_at + w.len > job.buf.len() || u32::try_from(w.len).is_err());
            if injected || too_big || windows.len() > 1 << WINDOW_BITS {
                // The synchronous path produces the exact error (or does the read).
                let result = reader.read(job.layer, job.expert, job.buf.as_mut_slice());
                return Err(Box::new(done_of(job, result, t0)));
            }
            let idx = match slab.iter().position(Option::is_none) {
                Some(i) => i,
                None => {
                    slab.push(None);
                    slab.len() - 1
                }
            };
            let base = job.buf.as_mut_slice().as_mut_ptr();
            let mut pushed = 0;
            for (wi, w) in windows.iter().enumerate() {
                let Some(file) = reader.file(w.shard) else {
                    break;
                };
                // SAFETY: `w.slot_at + w.len` is within the slot (checked above), so the
                // pointer and length name memory of the job's buffer, which stays in the slab
                // (its heap allocation does not move) until every window's completion came
                // back; nothing else touches the buffer meanwhile.
                let sqe = opcode::Read::new(
                    types::Fd(file.as_raw_fd()),
                    unsafe { base.add(w.slot_at) },
                    w.len as u32,
                )
                .offset(w.file_offset)
                .build()
                .user_data(((idx as u64) << WINDOW_BITS) | wi as u64);
                // SAFETY: as above: the buffer outlives the read.
                if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                    break;
                }
                pushed += 1;
            }
            // (The depth keeps every job's windows within the queue; should a push still fail,
            // the windows not queued count as failed, and once the queued ones came back
            // through the normal path the whole job is read again with pread.)
            let n = windows.len();
            if pushed == 0 {
                let result = reader.read(job.layer, job.expert, job.buf.as_mut_slice());
                return Err(Box::new(done_of(job, result, t0)));
            }
            let mut got = vec![None; n];
            for g in &mut got[pushed..] {
                *g = Some(Err(libc::EBUSY));
            }
            slab[idx] = Some(Active {
                job,
                windows,
                got,
                done_ns: vec![0; n],
                left: pushed,
                t0,
            });
            Ok(())
        }
    }

    /// The job's result from its windows' completions.
    fn complete(reader: &ExpertReader, a: &Active) -> Result<u64, StoreError> {
        let mut bytes = 0u64;
        for (w, got) in a.windows.iter().zip(&a.got) {
            match got {
                Some(Ok(n)) if *n >= w.need => bytes += w.len as u64,
                Some(Ok(n)) => {
                    return Err(reader.short_read_error(a.job.layer, a.job.expert, w, *n));
                }
                Some(Err(errno)) => {
                    return Err(reader.read_error(
                        a.job.layer,
                        a.job.expert,
                        w,
                        std::io::Error::from_raw_os_error(*errno).to_string(),
                    ));
                }
                None => {
                    return Err(reader.read_error(
                        a.job.layer,
                        a.job.expert,
                        w,
                        "io_uring: no completion".into(),
                    ));
                }
            }
        }
        Ok(bytes)
    }

    /// A window that came back short (the kernel may split a read) is finished with `pread`;
    /// the file's true end still gives the short-read error.
    fn retry_sync(reader: &ExpertReader, a: &mut Active) -> Result<u64, StoreError> {
        let mut bytes = 0u64;
        for (w, got) in a.windows.iter().zip(&a.got) {
            let mut have = match got {
                Some(Ok(n)) => *n,
                _ => 0,
            };
            let Some(file) = reader.file(w.shard) else {
                return Err(reader.read_error(a.job.layer, a.job.expert, w, "no file".into()));
            };
            let slot = a.job.buf.as_mut_slice();
            let buf = &mut slot[w.slot_at..w.slot_at + w.len];
            while have < w.need {
                let n = file
                    .read_at(&mut buf[have..], w.file_offset + have as u64)
                    .map_err(|e| reader.read_error(a.job.layer, a.job.expert, w, e.to_string()))?;
                if n == 0 {
                    return Err(reader.short_read_error(a.job.layer, a.job.expert, w, have));
                }
                have += n;
            }
            bytes += w.len as u64;
        }
        Ok(bytes)
    }

    fn finish(a: Active, result: Result<u64, StoreError>) -> ReadDone {
        done_of(a.job, result, a.t0)
    }

    fn done_of(job: ReadJob, result: Result<u64, StoreError>, t0: Instant) -> ReadDone {
        ReadDone {
            layer: job.layer,
            expert: job.expert,
            buf: job.buf,
            demand: job.demand,
            result,
            busy: t0.elapsed(),
            lane: 0,
            windows: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(expert: u32, demand: bool) -> ReadJob {
        ReadJob {
            layer: 0,
            expert,
            buf: AlignedBuf::new(0),
            demand,
        }
    }

    #[test]
    fn demand_reads_are_taken_before_speculative_ones() {
        let mut q = Queue::default();
        q.spec.push_back(job(1, false));
        q.spec.push_back(job(2, false));
        q.demand.push_back(job(3, true));
        q.demand.push_back(job(4, true));
        let order: Vec<u32> = std::iter::from_fn(|| q.pop()).map(|j| j.expert).collect();
        assert_eq!(order, [3, 4, 1, 2]);
    }
}
