//! Matrix × vector and small-batch matrix × matrix products over the thread pool.
//!
//! The weight matrix is `rows` rows of `cols` elements of one ggml type, stored row after row
//! (`rows * wtype.row_bytes(cols)` bytes, the layout of a GGUF tensor of ggml shape
//! `[cols, rows]`). Activations are f32. Each activation row is quantized once to the type the
//! weight's dot kernel pairs with ([`vec_dot_type`]), then output element `r` is
//! `dot(cols, weight_row_r, quantized_activation)`.
//!
//! Threads only decide who computes which output element: every element is computed by the
//! same kernel call on the same bytes as a plain single-threaded loop would make, so results
//! are bit-identical for any number of threads.

use std::slice::ChunksMut;
use std::sync::{Mutex, PoisonError};

use crate::kernels::{
    DotFn, DotPanel, DotRows, DotTokens, GroupedDot, Kernels, QuantizeFn, SumOrder, vec_dot_type,
};
use crate::pool::ThreadPool;
use crate::{GgmlType, QuantError};

/// Fewest weight rows in one unit of pool work (keeps the per-chunk overhead negligible).
const MIN_CHUNK_ROWS: usize = 16;
/// Most weight rows in one unit of pool work (keeps enough chunks for load balance).
const MAX_CHUNK_ROWS: usize = 64;
/// Aim for at least this many chunks per thread, so a thread that is slowed down (another
/// process on its core) costs little.
const CHUNKS_PER_THREAD: usize = 8;

/// The two kernels a product needs: the activation quantizer and the row dot product.
#[derive(Debug, Clone, Copy)]
pub struct RowKernel {
    /// Weight type.
    pub wtype: GgmlType,
    /// The summation order of `dot` and `dot_rows`.
    pub order: SumOrder,
    /// Activation type the dot kernel takes (`vec_dot_type(wtype)` for table kernels).
    pub act_type: GgmlType,
    /// `dot(cols, weight_row, activation_row)`.
    pub dot: DotFn,
    /// A kernel for several consecutive weight rows at once, if the table has one; it gives
    /// the same bits per row as `dot`, so using it never changes a result.
    pub dot_rows: Option<DotRows>,
    /// A kernel for tiles of several weight rows × several activation rows, if the table has
    /// one; [`matmul_with`] uses it for whole tiles. It gives the same bits per output as
    /// `dot`, so using it never changes a result.
    pub dot_tokens: Option<DotTokens>,
    /// A kernel for a group of weight rows against every activation row of a product at once
    /// (the order decodes each group of rows once), if the table has one; [`matmul_with`]
    /// uses it for whole groups, before `dot_tokens`. Same bits per output as `dot`.
    pub dot_panel: Option<DotPanel>,
    /// Quantizes one f32 activation row of `cols` elements to `act_type`.
    pub quantize: QuantizeFn,
    /// Kernels for the activation rows of a batched product ([`matmul_with`]) that the
    /// reproduced llama.cpp path multiplies in groups: of `n` rows, the first
    /// `n - n % group` are quantized and multiplied with these, the others (and the single
    /// row of [`matvec_with`]) with `quantize` / `dot` / `dot_rows` / `dot_tokens`. Only some
    /// of llama.cpp's repacked gemms sum a batch of 4 rows in another order than their gemv
    /// (Q4_K on x86; Q8_0 and Q6_K on ARM), and only for plain matrices: an expert stack is
    /// multiplied one row at a time. `None` elsewhere.
    pub grouped: Option<GroupedDot>,
    /// Ask the CPU to fetch upcoming weight rows ahead of the dot kernel (software
    /// prefetch, about 2 KiB ahead). This pays off when the weights stream from DRAM, the
    /// normal case when decoding a model much larger than the caches (measured +30-45% on one
    /// thread), and costs roughly 10-25% when the matrix is already in cache. Results do not
    /// depend on it. [`RowKernel::lookup`] turns it on, except for kernels that prefetch their
    /// rows themselves (the repacked-order MXFP4 kernels of 8 rows).
    pub prefetch: bool,
}

impl RowKernel {
    /// The kernels a table has for weight type `wtype` ([`SumOrder::VecDot`]).
    pub fn lookup(kernels: &Kernels, wtype: GgmlType) -> Result<RowKernel, QuantError> {
        RowKernel::lookup_in(kernels, wtype, SumOrder::VecDot)
    }

    /// The kernels of order `order` for weight type `wtype`; a type without a kernel of that
    /// order gets the [`SumOrder::VecDot`] kernels (`order` of the result says which).
    pub fn lookup_in(
        kernels: &Kernels,
        wtype: GgmlType,
        order: SumOrder,
    ) -> Result<RowKernel, QuantError> {
        let act_type = vec_dot_type(wtype).ok_or(QuantError::Unsupported {
            ty: wtype,
            op: "matrix product (no activation type)",
        })?;
        let order = if kernels.dot_in(order, wtype).is_some() {
            order
        } else {
            SumOrder::VecDot
        };
        let dot = kernels
            .dot_in(order, wtype)
            .ok_or(QuantError::Unsupported {
                ty: wtype,
                op: "matrix product (no dot kernel)",
            })?;
        let quantize = kernels
            .quantize_in(order, act_type)
            .ok_or(QuantError::Unsupported {
                ty: act_type,
                op: "activation quantization",
            })?;
        let dot_rows = kernels.dot_rows_in(order, wtype);
        // The 8-row repacked-order MXFP4 kernel prefetches the next group's rows itself; the
        // row prefetch on top only costs there (docs/performance.md, "MXFP4 at gpt-oss
        // shapes": on ÷ off 0.93-0.99 cold, 0.85-0.92 hot).
        let self_prefetching =
            order == SumOrder::Repacked && wtype == GgmlType::MXFP4 && dot_rows.is_some();
        Ok(RowKernel {
            wtype,
            order,
            act_type,
            dot,
            dot_rows,
            dot_tokens: kernels.dot_tokens_in(order, wtype),
            dot_panel: kernels.dot_panel_in(order, wtype),
            quantize,
            grouped: kernels.grouped_in(order, wtype),
            prefetch: !self_prefetching,
        })
    }

    /// The kernels llama.cpp's order prescribes for a weight ([`Kernels::order_for`]).
    pub fn for_weight(
        kernels: &Kernels,
        wtype: GgmlType,
        rows: usize,
        cols: usize,
        expert: bool,
    ) -> Result<RowKernel, QuantError> {
        let order = kernels.order_for(wtype, rows, cols, expert);
        let mut k = RowKernel::lookup_in(kernels, wtype, order)?;
        if expert {
            // llama.cpp's MUL_MAT_ID multiplies every row with its single-row kernel.
            k.grouped = None;
        }
        Ok(k)
    }
}

/// `out[r] = Σ_c W[r][c] · x[c]` for `r` in `0..rows`, with `W` the `rows × cols` weight
/// matrix of type `wtype` in `w`, using the kernels of `kernels` and the threads of `pool`.
///
/// `scratch` holds the quantized activation; pass the same vector again to reuse its
/// allocation.
#[allow(clippy::too_many_arguments)]
pub fn matvec(
    pool: &ThreadPool,
    kernels: &Kernels,
    wtype: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
    scratch: &mut Vec<u8>,
) -> Result<(), QuantError> {
    let kernel = RowKernel::lookup(kernels, wtype)?;
    matvec_with(pool, &kernel, w, rows, cols, x, out, scratch)
}

/// [`matvec`] with explicitly chosen kernels.
#[allow(clippy::too_many_arguments)]
pub fn matvec_with(
    pool: &ThreadPool,
    kernel: &RowKernel,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
    scratch: &mut Vec<u8>,
) -> Result<(), QuantError> {
    let shape = Shape::validate(kernel, w, rows, cols, x, 1, out)?;
    if shape.is_trivial() {
        out.fill(0.0);
        return Ok(());
    }
    quantize_rows(kernel, &shape, x, 0, scratch);
    let xq: &[u8] = scratch;
    let rb = shape.w_row_bytes;

    let ch = chunk_rows(rows, pool.n_threads());
    let n_chunks = rows.div_ceil(ch);
    // Hands out each output chunk once; the lock is taken once per chunk of rows.
    let chunks = Mutex::new(out.chunks_mut(ch).enumerate());
    pool.run(n_chunks, |_| {
        let Some((c, dst)) = chunks.lock().unwrap_or_else(PoisonError::into_inner).next() else {
            return;
        };
        let w_chunk = &w[c * ch * rb..(c * ch + dst.len()) * rb];
        let mut ahead = RowPrefetcher::new(kernel.prefetch, w_chunk, rb);
        let dots = (kernel.dot, kernel.dot_rows);
        rows_times_vector(dots, cols, w_chunk, rb, xq, dst, &mut ahead);
    });
    Ok(())
}

/// Quantize one activation row `x` (of `cols` elements) into `out` (resized to fit) as
/// `kernel`'s products take it, for [`MatvecJob::xq`].
pub fn quantize_activation(
    kernel: &RowKernel,
    cols: usize,
    x: &[f32],
    out: &mut Vec<u8>,
) -> Result<(), QuantError> {
    let overflow = QuantError::ShapeOverflow {
        ty: kernel.act_type,
        rows: 1,
        cols,
    };
    let arb = kernel
        .act_type
        .row_bytes(cols as u64)
        .ok_or(QuantError::NotBlockMultiple {
            ty: kernel.act_type,
            n: cols,
            block: kernel.act_type.block_size(),
        })?;
    let arb = usize::try_from(arb).map_err(|_| overflow)?;
    check_len(kernel.wtype, "activation", cols, x.len())?;
    out.clear();
    out.resize(arb, 0);
    (kernel.quantize)(x, out);
    Ok(())
}

/// One product of a [`matvec_many`] batch: `out[r] = dot(row r of w, xq)`.
#[derive(Debug)]
pub struct MatvecJob<'a> {
    /// The kernels (those of a one-row product).
    pub kernel: &'a RowKernel,
    /// `rows` weight rows of `cols` elements of `kernel.wtype`.
    pub w: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    /// The activation row quantized by [`quantize_activation`] with this `kernel`.
    pub xq: &'a [u8],
    /// `rows` outputs.
    pub out: &'a mut [f32],
}

/// Several matrix × vector products in one run of the pool: every job's rows are cut into
/// chunks and all chunks of all jobs are shared out together, so the threads meet once for the
/// whole batch instead of once per product (the routed experts of one token: every gate and
/// up projection in one run, every down projection in another). Each output element is
/// computed by the same kernel call on the same bytes as [`matvec_with`] makes for it, so the
/// results are bit-identical to running the jobs one by one.
pub fn matvec_many(pool: &ThreadPool, jobs: &mut [MatvecJob<'_>]) -> Result<(), QuantError> {
    let mut total_rows = 0usize;
    for j in jobs.iter() {
        let k = j.kernel;
        let overflow = QuantError::ShapeOverflow {
            ty: k.wtype,
            rows: j.rows,
            cols: j.cols,
        };
        let row_bytes = |ty: GgmlType| -> Result<usize, QuantError> {
            let b = ty
                .row_bytes(j.cols as u64)
                .ok_or(QuantError::NotBlockMultiple {
                    ty,
                    n: j.cols,
                    block: ty.block_size(),
                })?;
            usize::try_from(b).map_err(|_| overflow.clone())
        };
        let rb = row_bytes(k.wtype)?;
        let w_bytes = j.rows.checked_mul(rb).ok_or(overflow.clone())?;
        check_len(k.wtype, "weight", w_bytes, j.w.len())?;
        check_len(k.wtype, "activation", row_bytes(k.act_type)?, j.xq.len())?;
        check_len(k.wtype, "output", j.rows, j.out.len())?;
        total_rows = total_rows.checked_add(j.rows).ok_or(overflow)?;
    }
    let ch = chunk_rows(total_rows, pool.n_threads());
    // Every chunk of every job, in job order: (job, first row, outputs).
    struct Chunk<'a> {
        job: usize,
        row0: usize,
        dst: &'a mut [f32],
    }
    let mut chunks: Vec<Chunk<'_>> = Vec::with_capacity(total_rows.div_ceil(ch) + jobs.len());
    // Per job: kernels, weights, row bytes, quantized activation, columns.
    struct Plan<'a> {
        kernel: &'a RowKernel,
        w: &'a [u8],
        rb: usize,
        xq: &'a [u8],
        cols: usize,
    }
    let mut plan: Vec<Plan<'_>> = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter_mut().enumerate() {
        if j.cols == 0 {
            j.out.fill(0.0);
            plan.push(Plan {
                kernel: j.kernel,
                w: j.w,
                rb: 0,
                xq: j.xq,
                cols: 0,
            });
            continue;
        }
        plan.push(Plan {
            kernel: j.kernel,
            w: j.w,
            rb: j.w.len() / j.rows.max(1),
            xq: j.xq,
            cols: j.cols,
        });
        for (c, dst) in j.out.chunks_mut(ch).enumerate() {
            chunks.push(Chunk {
                job: i,
                row0: c * ch,
                dst,
            });
        }
    }
    let n_chunks = chunks.len();
    // Hands out each chunk once; the lock is taken once per chunk of rows.
    let queue = Mutex::new(chunks.into_iter());
    pool.run(n_chunks, |_| {
        let Some(Chunk { job, row0, dst }) =
            queue.lock().unwrap_or_else(PoisonError::into_inner).next()
        else {
            return;
        };
        let Plan {
            kernel,
            w,
            rb,
            xq,
            cols,
        } = plan[job];
        let w_chunk = &w[row0 * rb..(row0 + dst.len()) * rb];
        let mut ahead = RowPrefetcher::new(kernel.prefetch, w_chunk, rb);
        let dots = (kernel.dot, kernel.dot_rows);
        rows_times_vector(dots, cols, w_chunk, rb, xq, dst, &mut ahead);
    });
    Ok(())
}

/// Batched product for a few activation rows (prompt processing):
/// `out[t][r] = Σ_c W[r][c] · x[t][c]` for `t` in `0..n_tok`, with `x` `n_tok × cols` and
/// `out` `n_tok × rows`, both row-major.
///
/// Each activation row is quantized once; each chunk of weight rows is then multiplied with
/// all activation rows while it is in cache, in tiles of several rows × several tokens where
/// the table has a multi-token kernel ([`RowKernel::dot_tokens`]; the other rows and tokens go
/// through the one-token kernels). Every output has the bits of the single-row kernel on its
/// row and token, whatever the tiling, the number of tokens or of threads.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    pool: &ThreadPool,
    kernels: &Kernels,
    wtype: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
    scratch: &mut Vec<u8>,
) -> Result<(), QuantError> {
    let kernel = RowKernel::lookup(kernels, wtype)?;
    matmul_with(pool, &kernel, w, rows, cols, x, n_tok, out, scratch)
}

/// [`matmul`] with explicitly chosen kernels.
#[allow(clippy::too_many_arguments)]
pub fn matmul_with(
    pool: &ThreadPool,
    kernel: &RowKernel,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
    scratch: &mut Vec<u8>,
) -> Result<(), QuantError> {
    let shape = Shape::validate(kernel, w, rows, cols, x, n_tok, out)?;
    if shape.is_trivial() {
        out.fill(0.0);
        return Ok(());
    }
    let n_grouped = kernel.grouped.map_or(0, |g| n_tok - n_tok % g.group.max(1));
    quantize_rows(kernel, &shape, x, n_grouped, scratch);
    let xq: &[u8] = scratch;
    let rb = shape.w_row_bytes;
    let arb = shape.act_row_bytes;
    // The grouped activation rows, then the others: each with its kernels, its tile kernel
    // (for the whole tiles that fit in it) and its multi-row kernel.
    let fits = |t: &DotTokens, len: usize| {
        t.rows > 0 && t.tokens > 0 && t.rows * t.tokens <= MAX_TILE && len >= t.tokens
    };
    let segments = [
        kernel.grouped.map(|g| Segment {
            tokens: 0..n_grouped,
            dots: (g.dot, g.dot_rows),
            tiles: g.dot_tokens.filter(|t| fits(t, n_grouped)),
        }),
        Some(Segment {
            tokens: n_grouped..n_tok,
            dots: (kernel.dot, kernel.dot_rows),
            tiles: kernel.dot_tokens.filter(|t| fits(t, n_tok - n_grouped)),
        }),
    ];
    // (an array, not a vector: no allocation per product)
    let segments = segments.map(|s| s.filter(|s| !s.tokens.is_empty()));
    let segments = || segments.iter().flatten();
    let any_tiles = segments().any(|s| s.tiles.is_some());
    // A panel kernel takes whole groups of its rows with every (ungrouped) activation row.
    let panel = kernel
        .dot_panel
        .filter(|p| p.rows > 0 && n_grouped == 0 && rows >= p.rows);
    let prefetch = kernel.prefetch && (!any_tiles || TILE_PREFETCH) && panel.is_none();
    // Rows per step: a whole number of every multi-row, tile and panel kernel's rows.
    let group = segments().fold(panel.map_or(1, |p| p.rows), |g, s| {
        let g = lcm(g, s.dots.1.map_or(1, |d| d.rows.max(1)));
        s.tiles.map_or(g, |t| lcm(g, t.rows))
    });

    let ch = chunk_rows(rows, pool.n_threads());
    let n_chunks = rows.div_ceil(ch);
    // One cursor over all token rows of `out`, so that a task takes the same chunk index
    // from every token row in one locked step.
    struct Cursor<'a> {
        next: usize,
        per_token: Vec<ChunksMut<'a, f32>>,
    }
    let cursor = Mutex::new(Cursor {
        next: 0,
        per_token: out.chunks_mut(rows).map(|row| row.chunks_mut(ch)).collect(),
    });
    pool.run(n_chunks, |_| {
        let mut dst: Vec<&mut [f32]> = Vec::with_capacity(n_tok);
        let c = {
            let mut cur = cursor.lock().unwrap_or_else(PoisonError::into_inner);
            let c = cur.next;
            cur.next += 1;
            dst.extend(cur.per_token.iter_mut().filter_map(Iterator::next));
            c
        };
        if dst.len() != n_tok {
            return; // more claims than chunks: cannot happen with n_chunks tasks
        }
        let n = dst[0].len();
        let w_chunk = &w[c * ch * rb..(c * ch + n) * rb];
        if let Some(p) = panel {
            // Whole groups through the panel kernel (each group of rows decoded once for
            // every token), a short last group row by row.
            let mut buf = vec![0f32; n_tok * p.rows];
            let mut j = 0;
            while j + p.rows <= n {
                (p.f)(cols, &w_chunk[j * rb..(j + p.rows) * rb], xq, &mut buf);
                for (k, d) in dst.iter_mut().enumerate() {
                    d[j..j + p.rows].copy_from_slice(&buf[k * p.rows..(k + 1) * p.rows]);
                }
                j += p.rows;
            }
            if j < n {
                let mut none = RowPrefetcher::disabled(&w_chunk[j * rb..], rb);
                for (k, d) in dst.iter_mut().enumerate() {
                    let a_row = &xq[k * arb..(k + 1) * arb];
                    let dots = (kernel.dot, kernel.dot_rows);
                    rows_times_vector(
                        dots,
                        cols,
                        &w_chunk[j * rb..],
                        rb,
                        a_row,
                        &mut d[j..],
                        &mut none,
                    );
                }
            }
            return;
        }
        let mut ahead = RowPrefetcher::new(prefetch, w_chunk, rb);
        // Walk the chunk a group of weight rows at a time (a whole number of the multi-row
        // and tile kernels' widths), multiplying each group with every token while it is in
        // cache. The prefetcher runs ahead once per group, with the group's first pass.
        let mut j = 0;
        while j < n {
            let g = group.min(n - j);
            let w_group = &w_chunk[j * rb..(j + g) * rb];
            let mut ahead_group = RowPrefetcher::disabled(w_group, rb);
            let mut advanced = false;
            for seg in segments() {
                let mut k0 = seg.tokens.start;
                if let Some(t) = seg.tiles {
                    // The tokens of whole tiles, through the tile kernel for the rows of
                    // whole tiles.
                    let tiled_rows = g - g % t.rows;
                    let n_tiles = seg.tokens.len() / t.tokens;
                    if tiled_rows > 0 && n_tiles > 0 {
                        if !advanced {
                            for _ in 0..g {
                                ahead.advance();
                            }
                            advanced = true;
                        }
                        let mut buf = [0f32; MAX_TILE];
                        let buf = &mut buf[..t.rows * t.tokens];
                        for tile in 0..n_tiles {
                            let t0 = seg.tokens.start + tile * t.tokens;
                            let a = &xq[t0 * arb..(t0 + t.tokens) * arb];
                            for r0 in (0..tiled_rows).step_by(t.rows) {
                                let w_tile = &w_group[r0 * rb..(r0 + t.rows) * rb];
                                (t.f)(cols, w_tile, a, buf);
                                for (u, o) in buf.chunks_exact(t.rows).enumerate() {
                                    dst[t0 + u][j + r0..j + r0 + t.rows].copy_from_slice(o);
                                }
                            }
                            if tiled_rows < g {
                                for (u, a_row) in a.chunks_exact(arb).enumerate() {
                                    let d = &mut dst[t0 + u][j + tiled_rows..j + g];
                                    let w_rest = &w_group[tiled_rows * rb..];
                                    rows_times_vector(
                                        seg.dots,
                                        cols,
                                        w_rest,
                                        rb,
                                        a_row,
                                        d,
                                        &mut ahead_group,
                                    );
                                }
                            }
                        }
                        k0 += n_tiles * t.tokens;
                    }
                }
                for k in k0..seg.tokens.end {
                    let a = if advanced {
                        &mut ahead_group
                    } else {
                        advanced = true;
                        &mut ahead
                    };
                    let a_row = &xq[k * arb..(k + 1) * arb];
                    rows_times_vector(seg.dots, cols, w_group, rb, a_row, &mut dst[k][j..j + g], a);
                }
            }
            j += g;
        }
    });
    Ok(())
}

/// The activation rows `tokens` of a batched product and the kernels they are multiplied with.
struct Segment {
    tokens: std::ops::Range<usize>,
    dots: (DotFn, Option<DotRows>),
    tiles: Option<DotTokens>,
}

/// Most outputs of one tile kernel call ([`DotTokens`]) that [`matmul_with`] takes.
const MAX_TILE: usize = 64;

/// Whether [`matmul_with`] issues software prefetches (when [`RowKernel::prefetch`] is on) for
/// the weight rows it multiplies with the tile kernel. Measured on one thread, tile kernels on
/// matrices of 3-11 MB: with 82 tokens it helped Q8_0 by 1-3% (up to 15% in one noisy run)
/// and changed Q4_K/Q5_K/Q6_K by less than the noise; with 6 tokens (an expert's share of a
/// prompt) it cost Q8_0 2-10%. One prefetch pass per group of rows is cheap either way; it
/// stays on.
const TILE_PREFETCH: bool = true;

fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    a / gcd(a, b) * b
}

/// `dst[r] = dot(cols, row r of w_rows, xq)` for every row, through the multi-row kernel
/// where whole groups of its width remain and the single-row kernel for the rest (both give
/// the same bits per row).
#[inline]
fn rows_times_vector(
    (dot, dot_rows): (DotFn, Option<DotRows>),
    cols: usize,
    w_rows: &[u8],
    rb: usize,
    xq: &[u8],
    dst: &mut [f32],
    ahead: &mut RowPrefetcher<'_>,
) {
    let mut r = 0;
    if let Some(DotRows { rows: g, f }) = dot_rows
        && g > 0
    {
        while r + g <= dst.len() {
            for _ in 0..g {
                ahead.advance();
            }
            f(cols, &w_rows[r * rb..(r + g) * rb], xq, &mut dst[r..r + g]);
            r += g;
        }
    }
    for (o, w_row) in dst[r..].iter_mut().zip(w_rows[r * rb..].chunks_exact(rb)) {
        ahead.advance();
        *o = dot(cols, w_row, xq);
    }
}

/// Validated sizes of one product.
struct Shape {
    rows: usize,
    cols: usize,
    n_tok: usize,
    w_row_bytes: usize,
    act_row_bytes: usize,
}

impl Shape {
    fn validate(
        kernel: &RowKernel,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
        n_tok: usize,
        out: &[f32],
    ) -> Result<Shape, QuantError> {
        let wtype = kernel.wtype;
        let overflow = QuantError::ShapeOverflow {
            ty: wtype,
            rows,
            cols,
        };
        let row_bytes = |ty: GgmlType| -> Result<usize, QuantError> {
            let b = ty
                .row_bytes(cols as u64)
                .ok_or(QuantError::NotBlockMultiple {
                    ty,
                    n: cols,
                    block: ty.block_size(),
                })?;
            usize::try_from(b).map_err(|_| overflow.clone())
        };
        let w_row_bytes = row_bytes(wtype)?;
        let act_row_bytes = row_bytes(kernel.act_type)?;
        let w_bytes = rows.checked_mul(w_row_bytes).ok_or(overflow.clone())?;
        check_len(wtype, "weight", w_bytes, w.len())?;
        let x_len = n_tok.checked_mul(cols).ok_or(overflow.clone())?;
        check_len(wtype, "activation", x_len, x.len())?;
        let out_len = n_tok.checked_mul(rows).ok_or(overflow.clone())?;
        check_len(wtype, "output", out_len, out.len())?;
        n_tok.checked_mul(act_row_bytes).ok_or(overflow.clone())?;
        Ok(Shape {
            rows,
            cols,
            n_tok,
            w_row_bytes,
            act_row_bytes,
        })
    }

    /// No element to compute, or every element is an empty sum.
    fn is_trivial(&self) -> bool {
        self.rows == 0 || self.n_tok == 0 || self.cols == 0
    }
}

fn check_len(
    ty: GgmlType,
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), QuantError> {
    if expected == got {
        Ok(())
    } else {
        Err(QuantError::LengthMismatch {
            ty,
            what,
            expected,
            got,
        })
    }
}

/// Quantize every activation row into `scratch` (resized to fit); the first `n_grouped`
/// rows with the grouped kernels' quantizer ([`RowKernel::grouped`]).
fn quantize_rows(
    kernel: &RowKernel,
    shape: &Shape,
    x: &[f32],
    n_grouped: usize,
    scratch: &mut Vec<u8>,
) {
    scratch.clear();
    scratch.resize(shape.n_tok * shape.act_row_bytes, 0);
    let grouped = kernel.grouped.map_or(kernel.quantize, |g| g.quantize);
    for (k, (xr, qr)) in x
        .chunks_exact(shape.cols)
        .zip(scratch.chunks_exact_mut(shape.act_row_bytes))
        .enumerate()
    {
        if k < n_grouped {
            grouped(xr, qr);
        } else {
            (kernel.quantize)(xr, qr);
        }
    }
}

/// How far ahead of the row being computed [`RowPrefetcher`] requests weight bytes.
const PREFETCH_AHEAD_BYTES: usize = 2048;

/// Issues software prefetches for the rows of one chunk a fixed distance ahead of the row
/// being computed. The chunk's first rows are requested when it starts; prefetches never
/// leave the chunk (the next chunk is usually claimed by another thread).
struct RowPrefetcher<'a> {
    chunk: &'a [u8],
    row_bytes: usize,
    /// Byte offset up to which prefetches were issued.
    issued: usize,
    /// Byte offset of the row about to be computed.
    pos: usize,
    enabled: bool,
}

impl<'a> RowPrefetcher<'a> {
    fn new(enabled: bool, chunk: &'a [u8], row_bytes: usize) -> RowPrefetcher<'a> {
        RowPrefetcher {
            chunk,
            row_bytes,
            issued: 0,
            pos: 0,
            enabled,
        }
    }

    /// A prefetcher that does nothing (the rows were already requested).
    fn disabled(chunk: &'a [u8], row_bytes: usize) -> RowPrefetcher<'a> {
        RowPrefetcher::new(false, chunk, row_bytes)
    }

    /// Called before computing each row: make sure whole rows up to
    /// `PREFETCH_AHEAD_BYTES` past the end of this row are requested.
    #[inline]
    fn advance(&mut self) {
        if !self.enabled {
            return;
        }
        let want = (self.pos + self.row_bytes + PREFETCH_AHEAD_BYTES).min(self.chunk.len());
        while self.issued < want {
            let end = (self.issued + self.row_bytes).min(self.chunk.len());
            prefetch_bytes(&self.chunk[self.issued..end]);
            self.issued = end;
        }
        self.pos += self.row_bytes;
    }
}

/// Hint the CPU to bring every cache line of `bytes` into cache.
#[inline]
fn prefetch_bytes(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        const LINE: usize = 64;
        // Walk line-aligned addresses from the line holding the first byte to the end.
        let base = bytes.as_ptr();
        let misalign = base as usize % LINE;
        let mut off = 0;
        while off < bytes.len() + misalign {
            let p = base.wrapping_sub(misalign).wrapping_add(off);
            // SAFETY: `_mm_prefetch` needs only SSE, which every x86_64 CPU has (it is in the
            // target's baseline features). A prefetch is a hint: it never faults and never
            // reads into or writes any Rust-visible value, so the address need not even be
            // dereferenceable (it lies in the cache lines that hold `bytes`).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
            off += LINE;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Rows per unit of pool work for a matrix of `rows` rows on `n_threads` threads.
/// A multiple of 8, so that multi-row kernels (2, 4 or 8 rows wide) cover whole chunks.
fn chunk_rows(rows: usize, n_threads: usize) -> usize {
    rows.div_ceil(n_threads * CHUNKS_PER_THREAD)
        .next_multiple_of(8)
        .clamp(MIN_CHUNK_ROWS, MAX_CHUNK_ROWS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunking_covers_rows_with_bounded_chunks() {
        for rows in [1, 15, 16, 17, 100, 768, 2048, 151_936] {
            for threads in 1..=4 {
                let ch = chunk_rows(rows, threads);
                assert!((MIN_CHUNK_ROWS..=MAX_CHUNK_ROWS).contains(&ch));
                assert!(rows.div_ceil(ch) * ch >= rows);
            }
        }
        assert_eq!(chunk_rows(151_936, 2), MAX_CHUNK_ROWS);
        assert_eq!(chunk_rows(768, 2), 48);
    }
}
