//! `std::sort` and `std::partial_sort` as GCC's libstdc++ performs them (introsort with a
//! median-of-three pivot, heap selection), step for step, so that elements that compare equal
//! end up in the same order as in llama.cpp: neither algorithm is stable, and the order of
//! equal logits decides which tokens survive a cut and which one a draw lands on.
//!
//! `less(a, b)` is the comparator (`true` when `a` goes before `b`); it must be a strict weak
//! order (no NaN logits), otherwise the result is unspecified but indexing stays checked.

/// Moves `value` up from `hole` towards `top` (libstdc++'s `__push_heap`).
fn push_heap<T: Copy>(
    v: &mut [T],
    mut hole: usize,
    top: usize,
    value: T,
    less: &impl Fn(&T, &T) -> bool,
) {
    while hole > top {
        let parent = (hole - 1) / 2;
        if !less(&v[parent], &value) {
            break;
        }
        v[hole] = v[parent];
        hole = parent;
    }
    v[hole] = value;
}

/// Sifts the hole at `hole` down to a leaf, then pushes `value` back up
/// (libstdc++'s `__adjust_heap`). `len` is the heap length.
fn adjust_heap<T: Copy>(
    v: &mut [T],
    mut hole: usize,
    len: usize,
    value: T,
    less: &impl Fn(&T, &T) -> bool,
) {
    let top = hole;
    let mut child = hole;
    while len >= 1 && child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if less(&v[child], &v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len & 1 == 0 && len >= 2 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    push_heap(v, hole, top, value, less);
}

fn make_heap<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    let len = v.len();
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let value = v[parent];
        adjust_heap(v, parent, len, value, less);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

/// Puts the heap top of `v[..end]` at `result` and re-heaps `v[..end]` with the old
/// `v[result]` (libstdc++'s `__pop_heap`).
fn pop_heap<T: Copy>(v: &mut [T], end: usize, result: usize, less: &impl Fn(&T, &T) -> bool) {
    let value = v[result];
    v[result] = v[0];
    adjust_heap(v, 0, end, value, less);
}

fn sort_heap<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    let mut last = v.len();
    while last > 1 {
        last -= 1;
        pop_heap(v, last, last, less);
    }
}

/// `std::partial_sort(v.begin(), v.begin() + middle, v.end(), less)`: afterwards
/// `v[..middle]` holds the `middle` first elements in order; the rest is left in heap-select
/// order.
pub fn partial_sort<T: Copy>(v: &mut [T], middle: usize, less: &impl Fn(&T, &T) -> bool) {
    let middle = middle.min(v.len());
    make_heap(&mut v[..middle], less);
    for i in middle..v.len() {
        if middle > 0 && less(&v[i], &v[0]) {
            pop_heap(v, middle, i, less);
        }
    }
    sort_heap(&mut v[..middle], less);
}

const THRESHOLD: usize = 16;

fn move_median_to_first<T: Copy>(
    v: &mut [T],
    result: usize,
    a: usize,
    b: usize,
    c: usize,
    less: &impl Fn(&T, &T) -> bool,
) {
    let pick = if less(&v[a], &v[b]) {
        if less(&v[b], &v[c]) {
            b
        } else if less(&v[a], &v[c]) {
            c
        } else {
            a
        }
    } else if less(&v[a], &v[c]) {
        a
    } else if less(&v[b], &v[c]) {
        c
    } else {
        b
    };
    v.swap(result, pick);
}

/// Hoare partition of `v[first..last]` around `v[pivot]` without bound checks in the
/// original (the median of three guarantees sentinels); returns the cut.
fn unguarded_partition<T: Copy>(
    v: &mut [T],
    mut first: usize,
    mut last: usize,
    pivot: usize,
    less: &impl Fn(&T, &T) -> bool,
) -> usize {
    loop {
        while less(&v[first], &v[pivot]) {
            first += 1;
        }
        last -= 1;
        while less(&v[pivot], &v[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        v.swap(first, last);
        first += 1;
    }
}

fn introsort_loop<T: Copy>(
    v: &mut [T],
    first: usize,
    mut last: usize,
    mut depth: u32,
    less: &impl Fn(&T, &T) -> bool,
) {
    while last - first > THRESHOLD {
        if depth == 0 {
            partial_sort(&mut v[first..last], last - first, less);
            return;
        }
        depth -= 1;
        let mid = first + (last - first) / 2;
        move_median_to_first(v, first, first + 1, mid, last - 1, less);
        let cut = unguarded_partition(v, first + 1, last, first, less);
        introsort_loop(v, cut, last, depth, less);
        last = cut;
    }
}

fn unguarded_linear_insert<T: Copy>(v: &mut [T], mut last: usize, less: &impl Fn(&T, &T) -> bool) {
    let value = v[last];
    while less(&value, &v[last - 1]) {
        v[last] = v[last - 1];
        last -= 1;
    }
    v[last] = value;
}

fn insertion_sort<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    for i in 1..v.len() {
        if less(&v[i], &v[0]) {
            let value = v[i];
            v.copy_within(0..i, 1);
            v[0] = value;
        } else {
            unguarded_linear_insert(v, i, less);
        }
    }
}

/// `std::sort(v.begin(), v.end(), less)`.
pub fn sort<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    let n = v.len();
    if n < 2 {
        return;
    }
    let depth = 2 * n.ilog2();
    introsort_loop(v, 0, n, depth, less);
    if n > THRESHOLD {
        insertion_sort(&mut v[..THRESHOLD], less);
        for i in THRESHOLD..n {
            unguarded_linear_insert(v, i, less);
        }
    } else {
        insertion_sort(v, less);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(state: &mut u64) -> u32 {
        *state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (*state >> 33) as u32
    }

    #[test]
    fn sorts_like_a_sort() {
        let mut s = 1;
        for n in [0usize, 1, 2, 3, 15, 16, 17, 100, 1000, 5000] {
            for modulus in [2u32, 7, 1 << 30] {
                let mut v: Vec<(u32, usize)> = (0..n).map(|i| (lcg(&mut s) % modulus, i)).collect();
                let mut expect = v.clone();
                sort(&mut v, &|a: &(u32, usize), b: &(u32, usize)| a.0 > b.0);
                expect.sort_by_key(|x| std::cmp::Reverse(x.0));
                let keys: Vec<u32> = v.iter().map(|x| x.0).collect();
                let want: Vec<u32> = expect.iter().map(|x| x.0).collect();
                assert_eq!(keys, want);
                let mut ids: Vec<usize> = v.iter().map(|x| x.1).collect();
                ids.sort_unstable();
                assert_eq!(ids, (0..n).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn partial_sort_puts_the_smallest_first() {
        let mut s = 5;
        for n in [1usize, 2, 10, 300] {
            for middle in [0usize, 1, 2, 9, n / 2, n] {
                let mut v: Vec<u32> = (0..n).map(|_| lcg(&mut s) % 50).collect();
                let mut expect = v.clone();
                expect.sort_unstable();
                partial_sort(&mut v, middle, &|a: &u32, b: &u32| a < b);
                let m = middle.min(n);
                assert_eq!(v[..m], expect[..m]);
                let mut rest = v[m..].to_vec();
                rest.sort_unstable();
                assert_eq!(rest, expect[m..]);
            }
        }
    }
}
