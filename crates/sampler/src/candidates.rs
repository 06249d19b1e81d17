//! The candidate list and the filtering stages of llama.cpp's sampler chain, each with
//! llama.cpp's arithmetic (f32 softmax with the maximum subtracted, sequential sums) and its
//! element order (libstdc++'s unstable sorts), so that the surviving tokens, their order and
//! the drawn token match llama.cpp bit for bit.

use crate::cxxsort;

/// One candidate token: id, (possibly rescaled) logit and the probability the last stage that
/// computed probabilities left (0 until then).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenData {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
}

fn before(a: &TokenData, b: &TokenData) -> bool {
    a.logit > b.logit
}

/// `std::max(a, b)` for floats: `b` only when `a < b`.
fn cxx_max(a: f32, b: f32) -> f32 {
    if a < b { b } else { a }
}

/// Truncation of a float to `i32` as x86's `cvttss2si` does it (what a C cast compiles to):
/// NaN and out-of-range values give `i32::MIN`.
fn trunc_i32_x86(x: f32) -> i32 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        x as i32
    } else {
        i32::MIN
    }
}

const N_BUCKETS: usize = 128;
const BUCKET_LOW: f32 = -10.0;
const BUCKET_HIGH: f32 = 10.0;
const BUCKET_SCALE: f32 = N_BUCKETS as f32 / (BUCKET_HIGH - BUCKET_LOW);
const BUCKET_INTER: f32 = -BUCKET_LOW * BUCKET_SCALE;

/// Reusable buffers of the bucketed partial sort.
#[derive(Clone, Debug, Default)]
struct Scratch {
    bucket_of: Vec<u8>,
    sorted: Vec<TokenData>,
}

/// The `npartial` highest-logit candidates of `data`, in order, written to `out` (which may
/// end up longer than `npartial`: its tail is the rest of the last bucket touched). llama.cpp
/// spreads the logits over 128 equal buckets on [-10, 10) (clamped at both ends), keeps the
/// top buckets that hold at least `npartial` tokens in their original order, fully sorts all
/// but the lowest kept bucket and partially sorts that one.
fn bucket_partial_sort(
    data: &[TokenData],
    npartial: usize,
    bucket_of: &mut Vec<u8>,
    out: &mut Vec<TokenData>,
) {
    let mut histo = [0usize; N_BUCKETS];
    bucket_of.clear();
    bucket_of.extend(data.iter().map(|t| {
        let ib =
            trunc_i32_x86(BUCKET_SCALE * t.logit + BUCKET_INTER).clamp(0, N_BUCKETS as i32 - 1);
        histo[ib as usize] += 1;
        ib as u8
    }));
    let mut have = 0usize;
    let mut low = 0usize;
    for ib in (0..N_BUCKETS).rev() {
        have += histo[ib];
        low = ib;
        if have >= npartial {
            break;
        }
    }
    // Start offset of each kept bucket in `out`, highest bucket first.
    let mut start = [0usize; N_BUCKETS];
    let mut pos = 0;
    for ib in (low..N_BUCKETS).rev() {
        start[ib] = pos;
        pos += histo[ib];
    }
    let fill = TokenData {
        id: 0,
        logit: 0.0,
        p: 0.0,
    };
    out.clear();
    out.resize(have, fill);
    for (t, &ib) in data.iter().zip(bucket_of.iter()) {
        let ib = ib as usize;
        if ib >= low {
            out[start[ib]] = *t;
            start[ib] += 1;
        }
    }
    let mut at = 0;
    let mut done = 0;
    for ib in (low + 1..N_BUCKETS).rev() {
        cxxsort::sort(&mut out[at..at + histo[ib]], &before);
        at += histo[ib];
        done += histo[ib];
    }
    let end = at + histo[low];
    cxxsort::partial_sort(&mut out[at..end], npartial.saturating_sub(done), &before);
}

/// The candidate tokens between the stages of the chain (llama.cpp's `llama_token_data_array`):
/// a list, its live length and whether it is known to be sorted by descending logit.
#[derive(Clone, Debug, Default)]
pub struct Candidates {
    data: Vec<TokenData>,
    size: usize,
    sorted: bool,
    scratch: Scratch,
}

impl Candidates {
    /// An empty list; [`Candidates::fill`] loads logits, reusing the allocation.
    pub fn new() -> Self {
        Self::default()
    }

    /// Candidates for all token ids of `logits`, in id order, unsorted.
    pub fn from_logits(logits: &[f32]) -> Self {
        let mut c = Self::new();
        c.fill(logits);
        c
    }

    /// Replaces the contents with one candidate per logit (id = index), unsorted. NaN logits
    /// become -inf (llama.cpp's sorts are undefined on NaN).
    ///
    /// # Panics
    /// If there are more than `u32::MAX` logits.
    pub fn fill(&mut self, logits: &[f32]) {
        assert!(
            u32::try_from(logits.len()).is_ok(),
            "more logits than 32-bit token ids"
        );
        self.data.clear();
        self.data
            .extend(logits.iter().enumerate().map(|(i, &logit)| TokenData {
                id: i as u32,
                logit: if logit.is_nan() {
                    f32::NEG_INFINITY
                } else {
                    logit
                },
                p: 0.0,
            }));
        self.size = logits.len();
        self.sorted = false;
    }

    /// The live candidates, in their current order.
    pub fn as_slice(&self) -> &[TokenData] {
        &self.data[..self.size]
    }

    /// The ids of the live candidates, in their current order.
    pub fn ids(&self) -> Vec<u32> {
        self.as_slice().iter().map(|t| t.id).collect()
    }

    pub fn len(&self) -> usize {
        self.size
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Whether the list is known to be sorted by descending logit.
    pub fn is_sorted(&self) -> bool {
        self.sorted
    }

    /// Keeps the `npartial` best candidates, sorted (std::partial_sort up to 128, the bucketed
    /// sort above).
    fn partial_sort_inplace(&mut self, npartial: usize) {
        if npartial <= 128 {
            cxxsort::partial_sort(&mut self.data[..self.size], npartial, &before);
        } else {
            let Scratch { bucket_of, sorted } = &mut self.scratch;
            bucket_partial_sort(&self.data[..self.size], npartial, bucket_of, sorted);
            self.data[..npartial].copy_from_slice(&sorted[..npartial]);
        }
        self.size = npartial;
        self.sorted = true;
    }

    /// f32 softmax into `p` (maximum subtracted; sequential f32 sum), without sorting.
    fn softmax(&mut self) {
        let live = &mut self.data[..self.size];
        let Some(first) = live.first() else { return };
        let mut max_l = first.logit;
        if !self.sorted {
            for t in &live[1..] {
                max_l = cxx_max(max_l, t.logit);
            }
        }
        let mut sum = 0.0f32;
        for t in live.iter_mut() {
            t.p = (t.logit - max_l).exp();
            sum += t.p;
        }
        for t in live.iter_mut() {
            t.p /= sum;
        }
    }

    /// Top-k: keeps the `k` highest logits, sorted; `k <= 0` keeps everything untouched.
    /// Among equal logits the survivors and their order are those of libstdc++'s partial sort.
    pub fn top_k(&mut self, k: i32) {
        if k <= 0 {
            return;
        }
        let k = (k as usize).min(self.size);
        if !self.sorted {
            self.partial_sort_inplace(k);
        }
        self.size = k;
    }

    /// Top-p (nucleus): keeps the shortest prefix of the candidates sorted by descending
    /// probability whose running f32 sum is `>= p` (and at least `min_keep` long); `p >= 1`
    /// keeps everything untouched. Leaves the list sorted and probabilities in `p`.
    pub fn top_p(&mut self, p: f32, min_keep: usize) {
        if p >= 1.0 || self.size == 0 {
            return;
        }
        self.softmax();
        let size = self.size;
        // Large unsorted lists: sort only the best 256 first and the rest if the sum needs it.
        let mut bucketed = false;
        let mut k = size;
        if !self.sorted && size > 1024 {
            k = 256;
            let Scratch { bucket_of, sorted } = &mut self.scratch;
            bucket_partial_sort(&self.data[..size], k, bucket_of, sorted);
            bucketed = true;
        } else if !self.sorted {
            self.partial_sort_inplace(size);
        }
        let mut cum = 0.0f32;
        let mut last = size;
        for i in 0..size {
            let pi = if bucketed {
                self.scratch.sorted[i].p
            } else {
                self.data[i].p
            };
            cum += pi;
            if cum >= p && i + 1 >= min_keep {
                last = i + 1;
                break;
            }
            if bucketed && i == k - 1 {
                k = size;
                let Scratch { bucket_of, sorted } = &mut self.scratch;
                bucket_partial_sort(&self.data[..size], k, bucket_of, sorted);
            }
        }
        if bucketed {
            self.data[..last].copy_from_slice(&self.scratch.sorted[..last]);
            self.sorted = true;
        }
        self.size = last;
    }

    /// Min-p: keeps the candidates whose probability is at least `p` times the highest one,
    /// judged on logits (`logit >= max_logit + ln p`); `p <= 0` keeps everything untouched.
    /// An unsorted list keeps its order; a sorted one is cut after its last passing token
    /// (at least `min_keep` and always the first).
    pub fn min_p(&mut self, p: f32, min_keep: usize) {
        if p <= 0.0 || self.size == 0 {
            return;
        }
        let ln_p = p.ln();
        if !self.sorted {
            let live = &mut self.data[..self.size];
            let mut max_l = -f32::MAX;
            for t in live.iter() {
                max_l = cxx_max(max_l, t.logit);
            }
            let min_logit = max_l + ln_p;
            let kept = live.iter().filter(|t| t.logit >= min_logit).count();
            if kept > 0 && kept >= min_keep {
                let mut w = 0;
                for r in 0..live.len() {
                    if live[r].logit >= min_logit {
                        live[w] = live[r];
                        w += 1;
                    }
                }
                self.size = kept;
                return;
            }
            self.partial_sort_inplace(self.size);
        }
        let min_logit = self.data[0].logit + ln_p;
        let mut i = 1;
        while i < self.size {
            if self.data[i].logit < min_logit && i >= min_keep {
                break;
            }
            i += 1;
        }
        self.size = i;
    }

    /// Temperature: divides every logit by `temp`; `temp <= 0` keeps the first candidate with
    /// the highest logit and sets every other logit to -inf.
    pub fn temp(&mut self, temp: f32) {
        let live = &mut self.data[..self.size];
        if live.is_empty() {
            return;
        }
        if temp <= 0.0 {
            let mut max_i = 0;
            let mut max_l = live[0].logit;
            for i in 1..live.len() {
                if live[i].logit > max_l {
                    live[max_i].logit = f32::NEG_INFINITY;
                    max_i = i;
                    max_l = live[i].logit;
                } else {
                    live[i].logit = f32::NEG_INFINITY;
                }
            }
            return;
        }
        for t in live.iter_mut() {
            t.logit /= temp;
        }
    }

    /// The final draw: f32 softmax terms summed in f64, one uniform double `u` from `rng`, and
    /// the first candidate whose running sum reaches `u` times the total. Normalises `p`.
    /// Returns the index into [`Candidates::as_slice`], `None` when empty (no draw then).
    pub fn dist(&mut self, rng: &mut crate::Mt19937) -> Option<usize> {
        let live = &mut self.data[..self.size];
        match live.len() {
            0 => return None,
            1 => {
                rng.next_f64();
                live[0].p = 1.0;
                return Some(0);
            }
            _ => {}
        }
        let mut max_l = live[0].logit;
        if !self.sorted {
            for t in &live[1..] {
                max_l = cxx_max(max_l, t.logit);
            }
        }
        let mut total = 0.0f64;
        for t in live.iter_mut() {
            t.p = (t.logit - max_l).exp();
            total += f64::from(t.p);
        }
        let u = rng.next_f64();
        let target = total * u;
        let mut run = 0.0f64;
        let mut selected = None;
        for (i, t) in live.iter_mut().enumerate() {
            if selected.is_none() {
                run += f64::from(t.p);
                if run >= target {
                    selected = Some(i);
                }
            }
            t.p = (f64::from(t.p) / total) as f32;
        }
        Some(selected.unwrap_or(live.len() - 1))
    }
}
