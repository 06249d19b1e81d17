//! A persistent compute thread pool.
//!
//! [`ThreadPool::new(n)`](ThreadPool::new) spawns `n - 1` worker threads once; the thread that
//! calls [`ThreadPool::run`] is the n-th worker. A run publishes a job of `n_tasks` task
//! indices; every participating thread (the caller included) claims indices from one shared
//! atomic counter until none are left, so a slow or busy core simply claims fewer tasks.
//! Between runs a worker spins for a short while (new work usually follows within
//! microseconds during inference) and then parks, so an idle pool costs no CPU.
//!
//! Guarantees:
//! - every task index in `0..n_tasks` runs exactly once, unless a task panics (then the
//!   remaining unclaimed tasks are skipped);
//! - `run` returns only after every task that started has finished;
//! - a panic in a task is caught and resumed on the caller of `run` once all threads have
//!   left the job; the pool stays usable afterwards;
//! - calling `run` from inside a task (of this or any other pool) does not deadlock: the
//!   nested run executes its tasks inline, sequentially, on the calling thread;
//! - runs from different threads at the same time are serialized;
//! - dropping the pool wakes and joins every worker.

use std::any::Any;
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use crate::QuantError;

/// How long an idle worker spins, watching for the next run, before it parks.
const SPIN_BEFORE_PARK: Duration = Duration::from_micros(50);

/// Spin iterations between clock reads while a worker spins.
const SPINS_PER_CLOCK_CHECK: u32 = 64;

/// Spin iterations of the caller, waiting for workers to leave a job, before it starts
/// yielding its time slice instead.
const CALLER_SPINS_BEFORE_YIELD: u32 = 1 << 14;

thread_local! {
    /// True while this thread executes pool tasks (always true on worker threads).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

type TaskFn<'a> = dyn Fn(usize) + Sync + 'a;

/// The job is shared with workers through a raw pointer, so the compiler cannot check this.
const _: () = {
    const fn assert_sync<T: Sync>() {}
    assert_sync::<Job<'static>>();
};

/// One run: lives on the caller's stack for the duration of [`ThreadPool::run`].
struct Job<'a> {
    f: &'a TaskFn<'a>,
    n_tasks: usize,
    /// Next unclaimed task index (may grow past `n_tasks`).
    next: AtomicUsize,
    /// The first panic payload caught in a task.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Job<'_> {
    /// Claim and run tasks until none are left. A panic cancels the unclaimed tasks and is
    /// stored for the caller.
    fn work(&self) {
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            loop {
                let i = self.next.fetch_add(1, Ordering::Relaxed);
                if i >= self.n_tasks {
                    break;
                }
                (self.f)(i);
            }
        }));
        if let Err(payload) = result {
            // Stop everyone from claiming further tasks.
            self.next.store(self.n_tasks, Ordering::Relaxed);
            let mut slot = self.panic.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.is_none() {
                *slot = Some(payload);
            }
        }
    }
}

/// State shared between the pool handle and its workers.
struct Shared {
    /// The current job, or null between runs. Its lifetime is erased; see [`JobGuard`] for
    /// why dereferencing it is sound.
    job: AtomicPtr<Job<'static>>,
    /// Workers that may be looking at `job` right now.
    in_job: AtomicUsize,
    /// Bumped for each run and at shutdown; workers watch it while idle.
    epoch: AtomicUsize,
    shutdown: AtomicBool,
}

/// A persistent pool of compute threads. See the [module docs](self).
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Handles to unpark the workers.
    threads: Vec<Thread>,
    /// Serializes runs started from different threads.
    run_lock: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads())
            .finish()
    }
}

impl ThreadPool {
    /// A pool of `n_threads` compute threads in total: `n_threads - 1` spawned workers plus
    /// the thread that calls [`run`](Self::run). `0` is treated as `1` (no workers).
    pub fn new(n_threads: usize) -> Result<ThreadPool, QuantError> {
        let shared = Arc::new(Shared {
            job: AtomicPtr::new(ptr::null_mut()),
            in_job: AtomicUsize::new(0),
            epoch: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
        });
        let mut pool = ThreadPool {
            shared,
            workers: Vec::new(),
            threads: Vec::new(),
            run_lock: Mutex::new(()),
        };
        for index in 1..n_threads.max(1) {
            let shared = Arc::clone(&pool.shared);
            let handle = thread::Builder::new()
                .name(format!("quant-pool-{index}"))
                .spawn(move || worker_main(&shared, 0))
                .map_err(|e| QuantError::ThreadSpawn {
                    index,
                    message: e.to_string(),
                })?; // on error, dropping `pool` joins the workers spawned so far
            pool.threads.push(handle.thread().clone());
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Total number of compute threads, the caller of [`run`](Self::run) included.
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Run `f(i)` for every `i` in `0..n_tasks`, spread over the pool's threads, and return
    /// when all of them are done. Tasks are claimed one index at a time in increasing order,
    /// so make each task a reasonable chunk of work (microseconds, not nanoseconds).
    ///
    /// If a task panics, the tasks not yet claimed are skipped and the first panic is
    /// resumed here after every thread has left the job.
    ///
    /// Called from inside a task, this runs the nested tasks inline on the current thread.
    pub fn run<F>(&self, n_tasks: usize, f: F)
    where
        F: Fn(usize) + Sync,
    {
        if n_tasks == 0 {
            return;
        }
        if self.workers.is_empty() || n_tasks == 1 || IN_TASK.get() {
            for i in 0..n_tasks {
                f(i);
            }
            return;
        }
        let lock = self.run_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let job = Job {
            f: &f,
            n_tasks,
            next: AtomicUsize::new(0),
            panic: Mutex::new(None),
        };
        {
            let guard = JobGuard::publish(&self.shared, &job);
            for t in &self.threads {
                t.unpark();
            }
            let was_in_task = IN_TASK.replace(true);
            job.work();
            IN_TASK.set(was_in_task);
            drop(guard); // waits until no worker can still see `job`
        }
        drop(lock);
        let payload = job
            .panic
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(payload) = payload {
            panic::resume_unwind(payload);
        }
    }
}

/// Publishes a job to the workers and, when dropped (normally or during unwinding),
/// withdraws it and waits until no worker can still reach it.
///
/// Soundness argument for the lifetime erasure of the published pointer: a worker
/// dereferences `Shared::job` only between its `in_job` increment and decrement, and only
/// if the pointer it loads after the increment is non-null. All four operations (worker:
/// increment `in_job`, load `job`; caller: store null into `job`, load `in_job`) are SeqCst,
/// so they are totally ordered: either the worker's load comes after the null store and it
/// sees null (or a later job that is again protected the same way), or its increment comes
/// before the caller's load of `in_job`, and the caller keeps waiting until the matching
/// decrement (Release, paired with the caller's SeqCst load, which also makes the task's
/// writes visible to the caller). Hence no worker touches the job after `drop` returns, and
/// the job outlives every access.
struct JobGuard<'s> {
    shared: &'s Shared,
}

impl<'s> JobGuard<'s> {
    fn publish(shared: &'s Shared, job: &Job<'_>) -> JobGuard<'s> {
        let erased = (job as *const Job<'_>).cast::<Job<'static>>().cast_mut();
        shared.job.store(erased, Ordering::SeqCst);
        shared.epoch.fetch_add(1, Ordering::SeqCst);
        JobGuard { shared }
    }
}

impl Drop for JobGuard<'_> {
    fn drop(&mut self) {
        self.shared.job.store(ptr::null_mut(), Ordering::SeqCst);
        let mut spins = 0u32;
        while self.shared.in_job.load(Ordering::SeqCst) != 0 {
            if spins < CALLER_SPINS_BEFORE_YIELD {
                spins += 1;
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        for t in &self.threads {
            t.unpark();
        }
        for w in self.workers.drain(..) {
            // A worker only ends by returning (tasks' panics are caught), so there is no
            // payload worth propagating out of a destructor.
            let _ = w.join();
        }
    }
}

/// `seen` is the epoch when the pool was created (not loaded here: a run or the shutdown may
/// already have bumped it before this thread starts, and must not be missed).
fn worker_main(shared: &Shared, mut seen: usize) {
    IN_TASK.set(true);
    loop {
        seen = wait_for_epoch_change(shared, seen);
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        shared.in_job.fetch_add(1, Ordering::SeqCst);
        let p = shared.job.load(Ordering::SeqCst);
        if !p.is_null() {
            // SAFETY: `p` was loaded after this thread registered in `in_job` and is
            // non-null, so the caller that published it is blocked in `JobGuard::drop` (or
            // has not reached it yet) until we deregister below; the `Job` on its stack is
            // alive until then. See `JobGuard` for the ordering argument. The job is only
            // accessed through shared references (atomics, a mutex and a `Sync` closure).
            let job = unsafe { &*p };
            job.work();
        }
        shared.in_job.fetch_sub(1, Ordering::Release);
    }
}

/// Spin, then park, until the epoch differs from `seen`; return the new epoch.
fn wait_for_epoch_change(shared: &Shared, seen: usize) -> usize {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let e = shared.epoch.load(Ordering::Acquire);
        if e != seen {
            return e;
        }
        spins += 1;
        if spins.is_multiple_of(SPINS_PER_CLOCK_CHECK) && start.elapsed() >= SPIN_BEFORE_PARK {
            break;
        }
        std::hint::spin_loop();
    }
    loop {
        let e = shared.epoch.load(Ordering::Acquire);
        if e != seen {
            return e;
        }
        // An unpark between the load above and this park leaves a token, so park returns
        // at once: no wake-up can be lost. Spurious returns just loop.
        thread::park();
    }
}
