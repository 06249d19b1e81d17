//! The i-quants llama.cpp writes without an importance matrix: IQ4_NL and IQ4_XS
//! (`quantize_row_iq4_nl_impl` with seven scale trials either side), and IQ3_S
//! (`quantize_row_iq3_s_impl`: a scale search over 19 trials, each group of four snapped to
//! the 512-point grid or its nearest neighbours on it).
//!
//! These are what `ggml_quantize_chunk` (and so `llama_model_quantize`) runs with no
//! importance matrix: every element weighted by its square. ggml's `quantize_row_iq4_nl_ref`
//! differs (no trials); the file quantizer is the one reproduced here.

use std::sync::OnceLock;

use super::{nearest_int, put_f16};
use crate::iq_tables::IQ3S_GRID;
use crate::tables::KVALUES_IQ4NL;

/// ggml's `GROUP_MAX_EPS`: a sub-block whose largest magnitude is below it gets scale 0.
const GROUP_MAX_EPS: f32 = 1e-15;

/// The index of the level of `values` nearest to `x` (ties go up unless strictly nearer the
/// lower one), as ggml's `best_index_int8`.
fn best_index_int8(values: &[i8; 16], x: f32) -> u8 {
    let v = |i: usize| f32::from(values[i]);
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// The weighted least-squares scale of one 32-element sub-block for the IQ4 levels, and its
/// level indices in `l`: ggml's first pass (scale from the largest magnitude) then the trials
/// `(itry + values[0]) / max` for `itry` in -7..=7, keeping the best.
fn iq4_block_scale(xb: &[f32], l: &mut [u8]) -> f32 {
    const NTRY: i32 = 7;
    let values = &KVALUES_IQ4NL;
    let weight = |x: f32| x * x;
    let (mut amax, mut max) = (0f32, 0f32);
    for &x in xb {
        if x.abs() > amax {
            amax = x.abs();
            max = x;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = f32::from(values[0]);
    let mut d = -max / v0;
    let mut id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (j, &x) in xb.iter().enumerate() {
        let li = best_index_int8(values, id * x);
        l[j] = li;
        let q = f32::from(values[usize::from(li)]);
        let w = weight(x);
        sumqx += w * q * x;
        sumq2 += w * q * q;
    }
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        id = (itry + i32::from(values[0])) as f32 / max;
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for &x in xb {
            let q = f32::from(values[usize::from(best_index_int8(values, id * x))]);
            let w = weight(x);
            sumqx += w * q * x;
            sumq2 += w * q * q;
        }
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Two 32-element halves' level indices packed as IQ4 stores them: byte `16i + j` holds
/// element `32i + j` low and `32i + 16 + j` high.
fn pack_iq4(l: &[u8], q4: &mut [u8]) {
    for (i, q) in q4.chunks_exact_mut(16).enumerate() {
        for (j, b) in q.iter_mut().enumerate() {
            *b = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
}

/// IQ4_NL: f16 scale, 16 bytes of 4-bit level indices.
pub(super) fn iq4_nl(x: &[f32], y: &mut [u8]) {
    let values = &KVALUES_IQ4NL;
    let mut l = [0u8; 32];
    let d = iq4_block_scale(x, &mut l);
    put_f16(y, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (lj, &xj) in l.iter_mut().zip(x) {
        *lj = best_index_int8(values, id * xj);
    }
    pack_iq4(&l, &mut y[2..18]);
}

/// IQ4_XS: f16 super-scale `d`, the high two bits of eight 6-bit sub-block scales (u16), their
/// low four bits (4 bytes), 128 bytes of level indices. Each sub-block's scale is
/// `d · (l - 32)` with `d = -max_scale / 32`.
pub(super) fn iq4_xs(x: &[f32], y: &mut [u8]) {
    let values = &KVALUES_IQ4NL;
    let mut l = [0u8; 256];
    let mut scales = [0f32; 8];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for (ib, s) in scales.iter_mut().enumerate() {
        *s = iq4_block_scale(&x[32 * ib..32 * ib + 32], &mut l[32 * ib..32 * ib + 32]);
        if s.abs() > amax_scale {
            amax_scale = s.abs();
            max_scale = *s;
        }
    }
    let d = -max_scale / 32.0;
    put_f16(y, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    for (ib, &s) in scales.iter().enumerate() {
        let ls = nearest_int(id * s).clamp(-32, 31);
        let dl = d * ls as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for j in 32 * ib..32 * ib + 32 {
            l[j] = best_index_int8(values, idl * x[j]);
        }
        let ls = (ls + 32) as u8;
        y[4 + ib / 2] |= (ls & 0xF) << (4 * (ib % 2));
        scales_h |= u16::from(ls >> 4) << (2 * ib);
    }
    y[2..4].copy_from_slice(&scales_h.to_le_bytes());
    pack_iq4(&l, &mut y[8..136]);
}

/// IQ3_S's 4096-entry map from a group of four 3-bit levels (`l0 | l1 << 3 | ...`) to its grid
/// index, and for each group off the grid the grid points nearest it: those at the three
/// smallest squared distances, in order of distance then index (ggml's `iq3xs_init_impl(512)`).
struct Iq3sTables {
    /// Grid index, or `!offset` (negative) into `neighbours` for a point off the grid.
    map: Vec<i32>,
    /// Per off-grid point: a count, then that many grid indices.
    neighbours: Vec<u16>,
}

/// The levels 0..=7 of a grid point's four bytes (stored as `2l + 1`).
fn iq3s_levels(k: usize) -> [i32; 4] {
    IQ3S_GRID[k].to_le_bytes().map(|b| (i32::from(b) - 1) / 2)
}

fn iq3s_tables() -> &'static Iq3sTables {
    static TABLES: OnceLock<Iq3sTables> = OnceLock::new();
    TABLES.get_or_init(|| {
        const NWANT: usize = 3;
        let mut map = vec![-1i32; 4096];
        for k in 0..IQ3S_GRID.len() {
            let u = iq3s_levels(k)
                .iter()
                .enumerate()
                .fold(0usize, |u, (i, &l)| u | ((l as usize) << (3 * i)));
            map[u] = k as i32;
        }
        let mut neighbours = Vec::new();
        let mut dist: Vec<(i32, u16)> = Vec::with_capacity(IQ3S_GRID.len());
        for (u, slot) in map.iter_mut().enumerate() {
            if *slot >= 0 {
                continue;
            }
            let pos: [i32; 4] = std::array::from_fn(|i| 2 * ((u >> (3 * i)) & 7) as i32 + 1);
            dist.clear();
            dist.extend((0..IQ3S_GRID.len()).map(|k| {
                let g = iq3s_levels(k);
                let d2 = (0..4).map(|i| (2 * g[i] + 1 - pos[i]).pow(2)).sum();
                (d2, k as u16)
            }));
            dist.sort_unstable();
            *slot = !(neighbours.len() as i32);
            let start = neighbours.len();
            neighbours.push(0);
            let (mut d2, mut nhave) = (dist[0].0, 1);
            for &(dj, k) in &dist {
                if dj > d2 {
                    if nhave == NWANT {
                        break;
                    }
                    d2 = dj;
                    nhave += 1;
                }
                neighbours.push(k);
            }
            neighbours[start] = (neighbours.len() - start - 1) as u16;
        }
        Iq3sTables { map, neighbours }
    })
}

/// The grid index of four levels, or the neighbour of that point with the least weighted
/// squared error against `xval` at `scale` (ggml's `iq3_find_best_neighbour`, which also
/// rewrites the levels to that neighbour's).
fn iq3s_snap(t: &Iq3sTables, l: &mut [i8], xval: &[f32], w: &[f32], scale: f32) -> (usize, bool) {
    let u = l
        .iter()
        .enumerate()
        .fold(0usize, |u, (i, &v)| u | ((v as usize) << (3 * i)));
    let m = t.map[u];
    if m >= 0 {
        return (m as usize, true);
    }
    let at = (!m) as usize;
    let n = usize::from(t.neighbours[at]);
    let mut best_d2 = f32::MAX;
    let mut best = usize::from(t.neighbours[at + 1]);
    for &k in &t.neighbours[at + 1..=at + n] {
        let g = IQ3S_GRID[usize::from(k)].to_le_bytes();
        let mut d2 = 0f32;
        for i in 0..4 {
            let diff = scale * f32::from(g[i]) - xval[i];
            d2 += w[i] * diff * diff;
        }
        if d2 < best_d2 {
            best_d2 = d2;
            best = usize::from(k);
        }
    }
    for (li, g) in l.iter_mut().zip(iq3s_levels(best)) {
        *li = g as i8;
    }
    (best, false)
}

/// Levels of four values at inverse scale `id`: `round((id·x - 1) / 2)` in 0..=7.
fn iq3s_levels_at(id: f32, xval: &[f32], l: &mut [i8]) {
    for (li, &x) in l.iter_mut().zip(xval) {
        *li = nearest_int(0.5 * (id * x - 1.0)).clamp(0, 7) as i8;
    }
}

fn iq3s_sums(weight: &[f32], xval: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for i in 0..weight.len() {
        let w = weight[i];
        let q = f32::from(2 * l[i] + 1);
        sumqx += w * xval[i] * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// IQ3_S: f16 `d`, 64 low bytes of grid indices, 8 bytes of their ninth bits, 32 bytes of
/// signs, 4 bytes of 4-bit sub-block scales (`d · (1 + 2l)`).
///
/// As in ggml, a 32-element sub-block that is all zero writes no grid indices or signs and
/// the later sub-blocks' indices and signs move up into its place (their ninth bits and
/// scales stay where they belong); the reader sees the shifted data. This is reproduced.
pub(super) fn iq3_s(x: &[f32], y: &mut [u8]) {
    const KMAXQ: i32 = 8;
    const QS: usize = 2;
    const QH: usize = QS + 64;
    const SIGNS: usize = QH + 8;
    const SCALES: usize = SIGNS + 32;
    let t = iq3s_tables();
    let mut scales = [0f32; 8];
    let mut max_scale = 0f32;
    let (mut qs_at, mut signs_at) = (QS, SIGNS);
    for (ib, xb) in x.chunks_exact(32).enumerate() {
        let weight: [f32; 32] = std::array::from_fn(|i| xb[i] * xb[i]);
        let waux = weight.map(f32::sqrt);
        let mut xval = [0f32; 32];
        let mut block_signs = [0u8; 4];
        for (k, s) in block_signs.iter_mut().enumerate() {
            for i in 0..8 {
                let v = xb[8 * k + i];
                if v >= 0.0 {
                    xval[8 * k + i] = v;
                } else {
                    xval[8 * k + i] = -v;
                    *s |= 1 << i;
                }
            }
        }
        let max = xval[1..]
            .iter()
            .fold(xval[0], |m, &v| if m > v { m } else { v });
        let mut l = [0i8; 32];
        if max == 0.0 {
            scales[ib] = 0.0;
            continue;
        }
        let mut best = 0f32;
        let mut scale = max / (2 * KMAXQ - 1) as f32;
        let mut on_grid = [false; 8];
        let mut laux = [0i8; 32];
        let mut on_grid_aux = [false; 8];
        for is in -9i32..=9 {
            let id = ((2 * KMAXQ - 1) as f32 + is as f32 * 0.2) / max;
            let this_scale = 1.0 / id;
            for (k, on_grid_k) in on_grid_aux.iter_mut().enumerate() {
                let g = 4 * k..4 * k + 4;
                iq3s_levels_at(id, &xval[g.clone()], &mut laux[g.clone()]);
                let (_, on) = iq3s_snap(
                    t,
                    &mut laux[g.clone()],
                    &xval[g.clone()],
                    &waux[g],
                    this_scale,
                );
                *on_grid_k = on;
            }
            let (sumqx, sumq2) = iq3s_sums(&weight, &xval, &laux);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                l = laux;
                on_grid = on_grid_aux;
            }
        }
        if on_grid.contains(&false) && scale > 0.0 {
            let id = 1.0 / scale;
            for k in 0..8 {
                let g = 4 * k..4 * k + 4;
                iq3s_levels_at(id, &xval[g.clone()], &mut l[g.clone()]);
                iq3s_snap(t, &mut l[g.clone()], &xval[g.clone()], &waux[g], scale);
            }
            let (sumqx, sumq2) = iq3s_sums(&weight, &xval, &l);
            if sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        if scale < 0.0 {
            scale = -scale;
            for s in &mut block_signs {
                *s = !*s;
            }
        }
        for k in 0..8 {
            // Every group is on the grid by now (snapped, or the all-zero start, which is).
            let u = l[4 * k..4 * k + 4]
                .iter()
                .enumerate()
                .fold(0usize, |u, (i, &v)| u | ((v as usize) << (3 * i)));
            let grid_index = usize::try_from(t.map[u]).unwrap_or(0);
            y[qs_at + k] = grid_index as u8;
            let bit = ib * 8 + k;
            y[QH + bit / 8] |= ((grid_index >> 8) as u8) << (bit % 8);
        }
        qs_at += 8;
        y[signs_at..signs_at + 4].copy_from_slice(&block_signs);
        signs_at += 4;
        scales[ib] = scale;
        max_scale = if max_scale > scale { max_scale } else { scale };
    }
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    put_f16(y, 0, d * 1.033);
    let id = 1.0 / d;
    for (ib, pair) in scales.chunks_exact(2).enumerate() {
        let l1 = nearest_int(0.5 * (id * pair[0] - 1.0)).clamp(0, 15) as u8;
        let l2 = nearest_int(0.5 * (id * pair[1] - 1.0)).clamp(0, 15) as u8;
        y[SCALES + ib] = l1 | (l2 << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_index_picks_the_nearest_level() {
        let v = &KVALUES_IQ4NL;
        assert_eq!(best_index_int8(v, -200.0), 0);
        assert_eq!(best_index_int8(v, 200.0), 15);
        assert_eq!(best_index_int8(v, 0.0), 8); // -10 and 1: 1 is nearer
        assert_eq!(best_index_int8(v, 7.0), 9); // 1 and 13: a tie goes up
        assert_eq!(best_index_int8(v, 6.9), 8);
        for (i, &q) in v.iter().enumerate() {
            assert_eq!(usize::from(best_index_int8(v, f32::from(q))), i);
        }
    }

    #[test]
    fn iq3s_tables_cover_every_point() {
        let t = iq3s_tables();
        assert_eq!(t.map.iter().filter(|&&m| m >= 0).count(), 512);
        for (u, &m) in t.map.iter().enumerate() {
            if m >= 0 {
                let k = m as usize;
                let back = iq3s_levels(k)
                    .iter()
                    .enumerate()
                    .fold(0usize, |u, (i, &l)| u | ((l as usize) << (3 * i)));
                assert_eq!(back, u);
                continue;
            }
            let at = (!m) as usize;
            let n = usize::from(t.neighbours[at]);
            assert!(n > 0, "point {u:#o} has no neighbours");
            // The list is in order of distance and holds at most three distances.
            let pos: [i32; 4] = std::array::from_fn(|i| ((u >> (3 * i)) & 7) as i32);
            let d2: Vec<i32> = t.neighbours[at + 1..=at + n]
                .iter()
                .map(|&k| {
                    let g = iq3s_levels(usize::from(k));
                    (0..4).map(|i| (2 * (g[i] - pos[i])).pow(2)).sum()
                })
                .collect();
            assert!(d2.windows(2).all(|w| w[0] <= w[1]));
            let mut distinct = d2.clone();
            distinct.dedup();
            assert!(distinct.len() <= 3);
        }
    }
}
