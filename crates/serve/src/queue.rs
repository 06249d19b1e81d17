//! The bounded FIFO of generation requests between the connections and the one engine: a
//! request is numbered as it joins, refused when the queue is full, taken out again when its
//! client leaves before it ran.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// One waiting request: its number (from 1, in arrival order), its work, and the mark its
/// connection sets when the client leaves.
pub struct Job<W> {
    pub seq: u64,
    pub work: W,
    pub cancelled: Arc<AtomicBool>,
}

/// The queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

struct State<W> {
    waiting: VecDeque<Job<W>>,
    next: u64,
    closed: bool,
}

/// Requests waiting for the engine, at most `cap` of them (the one running is not counted).
pub struct Queue<W> {
    state: Mutex<State<W>>,
    wake: Condvar,
    cap: usize,
}

impl<W> Queue<W> {
    pub fn new(cap: usize) -> Queue<W> {
        Queue {
            state: Mutex::new(State {
                waiting: VecDeque::new(),
                next: 1,
                closed: false,
            }),
            wake: Condvar::new(),
            cap,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<W>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `work` at the end: its number and cancel mark, or [`Full`].
    pub fn push(&self, work: W) -> Result<(u64, Arc<AtomicBool>), Full> {
        let mut s = self.lock();
        if s.closed || s.waiting.len() >= self.cap {
            return Err(Full);
        }
        let seq = s.next;
        s.next += 1;
        let cancelled = Arc::new(AtomicBool::new(false));
        s.waiting.push_back(Job {
            seq,
            work,
            cancelled: Arc::clone(&cancelled),
        });
        self.wake.notify_one();
        Ok((seq, cancelled))
    }

    /// The first waiting request, waiting for one; `None` once closed.
    pub fn pop(&self) -> Option<Job<W>> {
        let mut s = self.lock();
        loop {
            if s.closed {
                return None;
            }
            if let Some(j) = s.waiting.pop_front() {
                return Some(j);
            }
            s = self.wake.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Takes request `seq` out if it is still waiting (its client left).
    pub fn remove(&self, seq: u64) -> bool {
        let mut s = self.lock();
        let before = s.waiting.len();
        s.waiting.retain(|j| j.seq != seq);
        s.waiting.len() != before
    }

    /// Requests waiting now.
    pub fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// No more requests: `pop` returns `None`, `push` refuses.
    pub fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_in_first_out_within_the_cap() {
        let q = Queue::new(2);
        assert_eq!(q.push("a").map(|p| p.0), Ok(1));
        assert_eq!(q.push("b").map(|p| p.0), Ok(2));
        assert_eq!(q.push("c").map(|p| p.0), Err(Full));
        assert_eq!(q.pop().map(|j| (j.seq, j.work)), Some((1, "a")));
        assert_eq!(q.push("d").map(|p| p.0), Ok(3));
        assert!(q.remove(2));
        assert!(!q.remove(2));
        assert_eq!(q.pop().map(|j| (j.seq, j.work)), Some((3, "d")));
        assert!(q.is_empty());
    }

    #[test]
    fn pop_waits_for_a_push_or_the_close() {
        let q = Arc::new(Queue::new(1));
        let q2 = Arc::clone(&q);
        let t = std::thread::spawn(move || q2.pop().map(|j| j.work));
        q.push(7).unwrap();
        assert_eq!(t.join().unwrap(), Some(7));
        let q2 = Arc::clone(&q);
        let t = std::thread::spawn(move || q2.pop().map(|j| j.work));
        q.close();
        assert_eq!(t.join().unwrap(), None);
        assert_eq!(q.push(8).map(|p| p.0), Err(Full));
    }
}
