//! The head of the model: the final norm and output projection ([`Engine::output`]), and the
//! NextN (MTP) head run as a draft model ([`MtpState`], [`Engine::enable_mtp`],
//! [`Engine::mtp_draft`]).

use model::Model;
use quant::Kernels;

use super::weights::NextnW;
use super::{Engine, ForwardError, KV_CELL_PAD, add_bias, mm};
use crate::ops::{self, KvCache};

/// The NextN head run as a draft model ([`Engine::enable_mtp`]), with its own keys and values.
///
/// Its row at position `i` is the pair (the trunk's final hidden state at `i`, the token at
/// `i + 1`) and predicts the token at `i + 2`. The head holds the pairs of positions
/// `..n_past`; the context's later positions wait in `pend` (their hidden states) and
/// `pend_tok` (the tokens after the first of them) until the next draft runs them.
pub(super) struct MtpState<'a> {
    pub(super) w: NextnW<'a>,
    pub(super) kv: KvCache,
    pub(super) n_past: usize,
    /// Hidden states (after the output norm) of the context's positions `n_past..`.
    pend: Vec<f32>,
    /// The context's tokens at positions `n_past + 1..`.
    pend_tok: Vec<u32>,
    /// The token the head's row at `n_past` was last run with (a draft's first row): when the
    /// next call runs that token at `n_past + 1`, the row stands.
    prov: Option<u32>,
    /// Hidden states of the call being run (joined to `pend` when it succeeds).
    pub(super) new: Vec<f32>,
    /// The head's input rows `[enorm(embedding); hnorm(hidden)]`.
    inp: Vec<f32>,
    /// The last head row's logits, and its hidden state after the head's norm.
    logits: Vec<f32>,
    g: Vec<f32>,
}

impl MtpState<'_> {
    /// A call ran `tokens` at positions `start..` (its hidden states are in `new`).
    pub(super) fn ran(&mut self, start: usize, tokens: &[u32]) {
        let e = self.w.enorm.len();
        if self.pend.is_empty() && self.n_past != start {
            // nothing kept of positions before the call (the context was restored or the
            // head loaded after it): the head goes on from here
            self.n_past = start;
            self.pend_tok.clear();
        }
        let mut tokens = tokens;
        if self.prov.take() == tokens.first().copied() && self.pend.len() == e {
            // the draft's first row was run with this very token: it stands
            self.n_past += 1;
            self.pend.clear();
            tokens = &tokens[1..];
        } else if self.pend.is_empty() {
            tokens = &tokens[1..];
        }
        self.pend.append(&mut self.new);
        self.pend_tok.extend_from_slice(tokens);
    }

    /// The context was cut to `n` tokens.
    pub(super) fn cut(&mut self, n: usize) {
        let e = self.w.enorm.len();
        self.new.clear();
        self.prov = None;
        if n <= self.n_past {
            // (the head's row at `n - 1`, if any, was run with the token cut at `n`: it
            // stays, a draft-quality matter only)
            self.n_past = n;
            self.pend.clear();
            self.pend_tok.clear();
        } else {
            let rows = n - self.n_past;
            self.pend.truncate(rows * e);
            self.pend_tok.truncate(rows - 1);
        }
    }
}

/// The most likely token of `logits` (the first of equals) and its probability.
fn argmax_prob(logits: &[f32]) -> (u32, f32) {
    let mut best = (0usize, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    let sum: f64 = logits.iter().map(|&v| f64::from(v - best.1).exp()).sum();
    let p = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    (best.0 as u32, p)
}

impl<'a> Engine<'a> {
    /// Final norm and output head for the first `n` rows of `s.x` (the wanted tokens), into
    /// `dst`.
    pub(super) fn output(&mut self, n: usize, dst: &mut [f32]) -> Result<(), ForwardError> {
        let e = self.hp.n_embd as usize;
        let s = &mut self.s;
        ops::rms_norm(
            &s.x[..n * e],
            &self.w.output_norm,
            self.hp.rms_eps,
            &mut s.cur[..n * e],
        );
        self.emit_norm(n * e);
        let s = &mut self.s;
        let o = &self.w.output;
        mm(self.pool, o, o.data, &s.cur, n, dst, &mut s.qbuf)?;
        add_bias(dst, self.w.output_bias.as_ref());
        if let Some(k) = self.hp.logit_scale {
            for v in dst.iter_mut() {
                *v *= k;
            }
        }
        let cap = self.hp.logit_softcap;
        if cap != 0.0 {
            // as ggml: scale by 1/cap, tanh, scale by cap
            let inv = 1.0 / cap;
            for v in dst.iter_mut() {
                *v = (*v * inv).tanh() * cap;
            }
        }
        self.emit("result_output", None, dst);
        Ok(())
    }

    /// The final hidden states of the first `n` rows of `s.x` (after the output norm, as the
    /// logits see them), for the draft head.
    pub(super) fn record_hidden(&mut self, n: usize) {
        let e = self.hp.n_embd as usize;
        if let Some(m) = &mut self.mtp {
            let at = m.new.len();
            m.new.resize(at + n * e, 0.0);
            ops::rms_norm(
                &self.s.x[..n * e],
                &self.w.output_norm,
                self.hp.rms_eps,
                &mut m.new[at..],
            );
        }
    }

    /// Load the model's (first) NextN head to draft with ([`mtp_draft`](Self::mtp_draft)).
    /// From here on every call keeps its rows' final hidden states for the head (a prompt's
    /// last layer runs the FFN of its rows that otherwise stop after the attention, aside:
    /// the logits keep their bits).
    ///
    /// Refused when the model has no NextN layer, when its block is not multi-head attention,
    /// and where [`forward_rows`](Self::forward_rows) (which verifies the drafts) is refused.
    pub fn enable_mtp(&mut self, model: &Model<'a>, kernels: &Kernels) -> Result<(), ForwardError> {
        self.check_rows()?;
        let mut w = NextnW::load(model, kernels)?;
        // one-token order: a head row's bits do not depend on how the rows were grouped
        for m in w.mats_mut() {
            m.set_single_order(true);
        }
        let hp = &self.hp;
        let il = w.layer;
        let e = hp.n_embd as usize;
        let kv = KvCache::with_value_dim(
            self.cfg.kv_type,
            1,
            self.cfg.n_ctx.next_multiple_of(KV_CELL_PAD),
            hp.n_head_kv.at(il) as usize,
            hp.head_dim_k_at(il) as usize,
            hp.head_dim_v_at(il) as usize,
        )?;
        self.mtp = Some(Box::new(MtpState {
            w,
            kv,
            n_past: 0,
            pend: Vec::new(),
            pend_tok: Vec::new(),
            prov: None,
            new: Vec::new(),
            inp: vec![0.0; self.cfg.ubatch * 2 * e],
            logits: Vec::new(),
            g: Vec::new(),
        }));
        // the context so far has no hidden states: the head starts after it
        let n = self.n_past;
        if let Some(m) = &mut self.mtp {
            m.n_past = n;
        }
        Ok(())
    }

    /// True when [`enable_mtp`](Self::enable_mtp) loaded a draft head.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// Draft up to `max` tokens after `next` (the token drawn for position `n_past`) with the
    /// NextN head: its rows for the context's positions it has not run yet, the last one with
    /// `next`, then each draft fed back with the head's own hidden state. Each draft is the
    /// head's most likely token, with its probability; drafting stops at the first whose
    /// probability is below `p_min`. Nothing without a head, or before any call ran.
    pub fn mtp_draft(
        &mut self,
        next: u32,
        max: usize,
        p_min: f32,
    ) -> Result<Vec<(u32, f32)>, ForwardError> {
        let e = self.hp.n_embd as usize;
        let n_vocab = self.w.n_vocab;
        if next as usize >= n_vocab {
            return Err(ForwardError::BadToken {
                token: next,
                n_vocab,
            });
        }
        let Some(m) = &mut self.mtp else {
            return Ok(Vec::new());
        };
        let rows = m.pend.len() / e;
        if max == 0 || rows == 0 || m.pend_tok.len() + 1 != rows {
            return Ok(Vec::new());
        }
        let p0 = self.n_past - rows;
        let mut hidden = std::mem::take(&mut m.pend);
        let mut toks = std::mem::take(&mut m.pend_tok);
        toks.push(next);
        let first = self.head_rows(&hidden, &toks, p0);
        // the rows of positions before the last are the head's for good; the last one stands
        // if the next call runs `next` after it (the buffers go back, emptied, for reuse)
        hidden.drain(..(rows - 1) * e);
        toks.clear();
        if let Some(m) = &mut self.mtp {
            m.n_past = p0 + rows - 1;
            m.pend = hidden;
            m.pend_tok = toks;
            m.prov = Some(next);
        }
        let (mut d, mut p) = first?;
        let mut drafts = Vec::with_capacity(max);
        let mut g = Vec::with_capacity(e);
        let mut pos = p0 + rows;
        while p >= p_min {
            drafts.push((d, p));
            if drafts.len() == max || pos >= self.cfg.n_ctx {
                break;
            }
            // the head's last hidden state feeds the next row (the chained rows' keys and
            // values sit past the head's positions until real rows replace them)
            if let Some(m) = &mut self.mtp {
                std::mem::swap(&mut g, &mut m.g);
            }
            (d, p) = self.head_rows(&g, &[d], pos)?;
            pos += 1;
        }
        Ok(drafts)
    }

    /// Run the head's rows (`hidden` rows of the trunk's states, `tokens` after each) at
    /// positions `p0..`: the last row's most likely token and its probability; its logits
    /// and its hidden state after the head's norm are left in the head's buffers.
    fn head_rows(
        &mut self,
        hidden: &[f32],
        tokens: &[u32],
        p0: usize,
    ) -> Result<(u32, f32), ForwardError> {
        let e = self.hp.n_embd as usize;
        let n_vocab = self.w.n_vocab;
        let ub = self.cfg.ubatch;
        let single = self.single_rows;
        self.single_rows = true;
        let mut r = Ok(());
        let n_all = tokens.len();
        for (ci, chunk) in tokens.chunks(ub).enumerate() {
            let n = chunk.len();
            let first = ci * ub;
            r = self.head_chunk(
                &hidden[first * e..(first + n) * e],
                chunk,
                p0 + first,
                first + n == n_all,
            );
            if r.is_err() {
                break;
            }
        }
        self.single_rows = single;
        r?;
        let (Some(m), s) = (self.mtp.as_deref_mut(), &mut self.s) else {
            return Err(ForwardError::Unsupported("no draft head".into()));
        };
        let norm = m.w.head_norm.as_ref().unwrap_or(&self.w.output_norm);
        m.g.resize(e, 0.0);
        ops::rms_norm(&s.x[..e], norm, self.hp.rms_eps, &mut m.g);
        let out = m.w.head.as_ref().unwrap_or(&self.w.output);
        m.logits.resize(n_vocab, 0.0);
        mm(
            self.pool,
            out,
            out.data,
            &m.g,
            1,
            &mut m.logits,
            &mut s.qbuf,
        )?;
        if m.w.head.is_none() {
            add_bias(&mut m.logits, self.w.output_bias.as_ref());
        }
        Ok(argmax_prob(&m.logits))
    }

    /// One chunk of the head's rows; when `last`, leaves the last row's output at the start
    /// of `s.x`.
    fn head_chunk(
        &mut self,
        hidden: &[f32],
        tokens: &[u32],
        p0: usize,
        last: bool,
    ) -> Result<(), ForwardError> {
        let n = tokens.len();
        let e = self.hp.n_embd as usize;
        let eps = self.hp.rms_eps;
        let Some(m) = self.mtp.as_deref_mut() else {
            return Err(ForwardError::Unsupported("no draft head".into()));
        };
        let (embd, table) = match &m.w.embed {
            Some((t, d)) => (t, *d),
            None => (&self.w.token_embd, self.w.token_embd_data),
        };
        let s = &mut self.s;
        for (j, &tok) in tokens.iter().enumerate() {
            let rb = embd.row_bytes;
            let row = table
                .get(tok as usize * rb..(tok as usize + 1) * rb)
                .ok_or(ForwardError::BadToken {
                    token: tok,
                    n_vocab: table.len() / rb.max(1),
                })?;
            quant::dequantize_row(embd.ty, row, &mut s.cur[..e])?;
            let inp = &mut m.inp[j * 2 * e..(j + 1) * 2 * e];
            ops::rms_norm(&s.cur[..e], &m.w.enorm, eps, &mut inp[..e]);
            ops::rms_norm(&hidden[j * e..(j + 1) * e], &m.w.hnorm, eps, &mut inp[e..]);
        }
        let ep = &m.w.eh_proj;
        mm(
            self.pool,
            ep,
            ep.data,
            &m.inp[..n * 2 * e],
            n,
            &mut s.x[..n * e],
            &mut s.qbuf,
        )?;
        let nr = self.hp.rope.n_rot as usize;
        for t in 0..n {
            self.rope
                .fill_cache((p0 + t) as i64, &mut s.rope[t * nr..(t + 1) * nr]);
        }
        let il = m.w.layer;
        let keep = if last { n - 1..n } else { n..n };
        self.layer(il, n, p0, keep)
    }

    fn emit_norm(&self, len: usize) {
        self.emit("result_norm", None, &self.s.cur[..len]);
    }
}
