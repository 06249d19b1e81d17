//! Cancelling work in flight: the [`Control`] a front end shares between the thread that reads
//! requests (it cancels) and the generation (the engine checks it between prefill chunks and
//! the loop between tokens), and the test hook that holds a generation at a given point until
//! a cancel arrives.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};

use crate::notice::Notices;

/// Where the test hook `--test-hold` waits for a cancel request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Before prefill chunk K (0-based) of a generation or decision.
    Prefill(usize),
    /// Before the forward pass of generated token K (1-based).
    Decode(usize),
}

impl std::str::FromStr for Hold {
    type Err = String;
    fn from_str(s: &str) -> Result<Hold, String> {
        let bad = || format!("{s:?}: expected prefill:K or decode:K");
        let (what, k) = s.split_once(':').ok_or_else(bad)?;
        let k: usize = k.parse().map_err(|_| bad())?;
        match what {
            "prefill" => Ok(Hold::Prefill(k)),
            "decode" if k >= 1 => Ok(Hold::Decode(k)),
            _ => Err(bad()),
        }
    }
}

/// A cancel handle a front end keeps on any thread (`Send + Sync + Clone`): the same
/// [`Control`] the runtime checks, installed with
/// [`Runtime::install_control`](crate::generate::Runtime::install_control).
pub type CancelHandle = std::sync::Arc<Control>;

/// Cancel requests and the generation's checks, shared by the reader thread and the engine.
///
/// Work requests are numbered as they are read; a cancel applies to every request read before
/// it, so one that arrives before its request started still stops it, and one that arrives
/// when nothing is in flight stops nothing later.
pub struct Control {
    cancel_upto: AtomicU64,
    current: AtomicU64,
    closing: AtomicBool,
    in_prefill: AtomicBool,
    chunks: AtomicUsize,
    hold: Mutex<Option<Hold>>,
    wake: Condvar,
    notices: Notices,
}

impl Control {
    pub fn new(hold: Option<Hold>, notices: Notices) -> Control {
        Control {
            cancel_upto: AtomicU64::new(0),
            current: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            in_prefill: AtomicBool::new(false),
            chunks: AtomicUsize::new(0),
            hold: Mutex::new(hold),
            wake: Condvar::new(),
            notices,
        }
    }

    /// The request in flight was cancelled.
    pub fn cancelled(&self) -> bool {
        let c = self.current.load(Ordering::SeqCst);
        c != 0 && self.cancel_upto.load(Ordering::SeqCst) >= c
    }

    /// Request `seq` starts.
    pub fn start(&self, seq: u64) {
        self.chunks.store(0, Ordering::SeqCst);
        self.current.store(seq, Ordering::SeqCst);
    }

    /// The request in flight ended.
    pub fn done(&self) {
        self.current.store(0, Ordering::SeqCst);
    }

    /// Cancel request `seq` alone, whether it is in flight or still to start: an earlier
    /// request in flight goes on. The caller marks the request cancelled where whoever starts
    /// it will look (`queued`) before calling this, and the runner calls
    /// [`start`](Control::start) before it looks: then either the runner sees the mark and
    /// never runs the request, or this sees the request in flight and stops it.
    pub fn cancel_one(&self, seq: u64, queued: &AtomicBool) {
        queued.store(true, Ordering::SeqCst);
        if self.current.load(Ordering::SeqCst) == seq {
            self.cancel(seq);
        }
    }

    /// Cancel every request numbered up to `upto`.
    pub fn cancel(&self, upto: u64) {
        self.cancel_upto.fetch_max(upto, Ordering::SeqCst);
        let _g = self.hold.lock().unwrap_or_else(PoisonError::into_inner);
        self.wake.notify_all();
    }

    /// The input ended: nothing will cancel a held request any more.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let _g = self.hold.lock().unwrap_or_else(PoisonError::into_inner);
        self.wake.notify_all();
    }

    pub fn begin_prefill(&self) {
        self.in_prefill.store(true, Ordering::SeqCst);
    }

    pub fn end_prefill(&self) {
        self.in_prefill.store(false, Ordering::SeqCst);
    }

    /// The engine's check before each chunk: counts prefill chunks (for the test hold) and
    /// answers whether to stop.
    pub fn check(&self) -> bool {
        if self.in_prefill.load(Ordering::SeqCst) {
            let k = self.chunks.fetch_add(1, Ordering::SeqCst);
            self.hold_at(Hold::Prefill(k));
        }
        self.cancelled()
    }

    /// Before the forward pass of generated token `n`.
    pub fn hold_decode(&self, n: usize) {
        self.hold_at(Hold::Decode(n));
    }

    fn hold_at(&self, at: Hold) {
        let mut g = self.hold.lock().unwrap_or_else(PoisonError::into_inner);
        if *g != Some(at) {
            return;
        }
        *g = None;
        let what = match at {
            Hold::Prefill(k) => format!("prefill chunk {k}"),
            Hold::Decode(k) => format!("decode step {k}"),
        };
        self.notices.info(format!(
            "sluice: test hold at {what}: waiting for a cancel request"
        ));
        while !self.cancelled() && !self.closing.load(Ordering::SeqCst) {
            g = self.wake.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_handle_crosses_threads() {
        fn shareable<T: Send + Sync + Clone + 'static>() {}
        shareable::<CancelHandle>();
        let h: CancelHandle = std::sync::Arc::new(Control::new(None, Notices::silent()));
        h.start(1);
        let other = h.clone();
        std::thread::spawn(move || other.cancel(1))
            .join()
            .expect("thread");
        assert!(h.cancelled());
    }

    #[test]
    fn a_cancel_stops_the_requests_read_before_it() {
        let c = Control::new(None, Notices::silent());
        c.start(1);
        assert!(!c.cancelled());
        c.cancel(1);
        assert!(c.cancelled());
        c.done();
        // A later request is not stopped by an earlier cancel.
        c.start(2);
        assert!(!c.cancelled());
        assert!(!c.check());
    }

    #[test]
    fn cancel_one_spares_the_request_in_flight_and_stops_its_own() {
        let c = Control::new(None, Notices::silent());
        let later = AtomicBool::new(false);
        c.start(1);
        // Request 2 waits: cancelling it marks it and leaves request 1 running.
        c.cancel_one(2, &later);
        assert!(later.load(Ordering::SeqCst));
        assert!(!c.cancelled());
        c.done();
        // Request 1 in flight, cancelled by its own number.
        let own = AtomicBool::new(false);
        c.start(3);
        c.cancel_one(3, &own);
        assert!(c.cancelled());
    }

    #[test]
    fn holds_parse() {
        assert_eq!("prefill:0".parse::<Hold>(), Ok(Hold::Prefill(0)));
        assert_eq!("decode:2".parse::<Hold>(), Ok(Hold::Decode(2)));
        assert!("decode:0".parse::<Hold>().is_err());
        assert!("later:1".parse::<Hold>().is_err());
    }
}
