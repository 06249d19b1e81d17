//! The context's state: the linear-attention layers' recurrent states ([`RecState`]), a saved
//! copy of the whole context ([`KvState`]), and the engine's ways back to an earlier context
//! (truncation, reset, the rollback snapshot, save and restore).

use model::HParams;

use super::{Engine, EngineConfig, ForwardError, KV_CELL_PAD};
use crate::ops::{self, KvCache};

/// A linear-attention layer's state after the context's tokens: the convolution's last
/// inputs and the delta rule's matrices (see `ops::causal_conv`, `ops::gated_delta_rule`; an
/// LFM2 short-convolution layer has the convolution's alone).
#[derive(Debug)]
pub(crate) struct RecState {
    pub(super) conv: Vec<f32>,
    pub(super) ssm: Vec<f32>,
}

impl Clone for RecState {
    fn clone(&self) -> Self {
        RecState {
            conv: self.conv.clone(),
            ssm: self.ssm.clone(),
        }
    }

    /// Into the existing buffers (the per-call snapshot of [`Engine::set_rollback`] reuses
    /// them instead of allocating the states again).
    fn clone_from(&mut self, src: &Self) {
        self.conv.clone_from(&src.conv);
        self.ssm.clone_from(&src.ssm);
    }
}

impl RecState {
    /// Every layer's state at the empty context: zeros for the linear-attention layers,
    /// `None` for the others.
    pub(super) fn for_layers(hp: &HParams) -> Vec<Option<RecState>> {
        let nl = hp.n_layer as usize;
        (0..nl)
            .map(|il| {
                let (conv, ssm) = hp.recurrent_state_lens(il)?;
                Some(RecState {
                    conv: vec![0.0; conv],
                    ssm: vec![0.0; ssm],
                })
            })
            .collect()
    }

    fn clear(&mut self) {
        self.conv.fill(0.0);
        self.ssm.fill(0.0);
    }

    fn bytes(&self) -> usize {
        (self.conv.len() + self.ssm.len()) * 4
    }

    /// Every layer's state from `src` (same shapes, checked by the callers) into `dst`.
    fn copy_all(dst: &mut [Option<RecState>], src: &[Option<RecState>]) {
        for (d, s) in dst.iter_mut().zip(src) {
            if let (Some(d), Some(s)) = (d, s) {
                d.conv.copy_from_slice(&s.conv);
                d.ssm.copy_from_slice(&s.ssm);
            }
        }
    }
}

/// Every trunk layer's KV cache (a linear-attention layer's has no cells: its state is a
/// [`RecState`]).
pub(super) fn kv_caches(hp: &HParams, cfg: EngineConfig) -> Result<Vec<KvCache>, ForwardError> {
    let kv_type = cfg.kv_type;
    // llama.cpp rounds its context up to a multiple of 256 cells, and the cell count bounds
    // the (padded) KV length its attention sums over, which decides which kernels and which
    // softmax exponential it uses; the same cell count gives the same results for any -c.
    // Positions past `cfg.n_ctx` are still refused by `forward`.
    let kv_cells = cfg.n_ctx.next_multiple_of(KV_CELL_PAD);
    let kv = (0..hp.n_layer as usize)
        .map(|il| {
            if hp.is_recurrent(il) || hp.has_no_mixer(il) {
                // no KV cells: the layer's state is in `rs`, or it has no attention
                return KvCache::with_value_dim(kv_type, 1, 0, 1, 1, 1);
            }
            let n_kv = hp.n_head_kv.at(il) as usize;
            let hd = hp.head_dim_k_at(il) as usize;
            let hdv = hp.head_dim_v_at(il) as usize;
            if hp.mla.as_ref().is_some_and(|m| m.absorbed) {
                // the cached value is the compressed row that starts the key
                KvCache::with_values_in_keys(kv_type, 1, kv_cells, n_kv, hd, hdv)
            } else {
                KvCache::with_value_dim(kv_type, 1, kv_cells, n_kv, hd, hdv)
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(kv)
}

/// The context's state: its tokens' keys and values in every layer (see
/// [`Engine::save_state`]).
#[derive(Debug, Clone)]
pub struct KvState {
    n_past: usize,
    layers: Vec<ops::KvPrefix>,
    /// The linear-attention layers' states at `n_past`.
    recurrent: Vec<Option<RecState>>,
}

impl KvState {
    /// Tokens in the saved context.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Bytes of memory the copy holds.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(ops::KvPrefix::bytes).sum::<usize>()
            + self
                .recurrent
                .iter()
                .flatten()
                .map(RecState::bytes)
                .sum::<usize>()
    }
}

impl<'a> Engine<'a> {
    /// Forget every token after the first `n` (nothing happens when `n >= n_past`); the next
    /// [`forward`](Self::forward) continues at position `n`.
    ///
    /// A model with linear-attention layers (qwen35moe) keeps their state for the whole
    /// context, not per position: it can go back to where the last `forward` call started
    /// when [`set_rollback`](Self::set_rollback) is on (so a chat continues after its last
    /// answer's final token, which the next prompt renders anew); cutting it anywhere else
    /// empties the context (`n_past` becomes 0), and the caller runs the kept tokens again
    /// (or restores a state saved there with [`restore_state`](Self::restore_state)).
    pub fn truncate(&mut self, n: usize) {
        if n < self.n_past && self.has_recurrent_state() {
            self.back_to(n);
            return;
        }
        self.n_past = self.n_past.min(n);
        if let Some(m) = &mut self.mtp {
            m.cut(self.n_past);
        }
    }

    /// Empty the context.
    pub fn reset(&mut self) {
        self.n_past = 0;
        if let Some(m) = &mut self.mtp {
            m.cut(0);
        }
        self.rs_snap = None;
        for st in self.rs.iter_mut().flatten() {
            st.clear();
        }
    }

    /// Keep (or not) the linear-attention states as they were at the start of each
    /// [`forward`](Self::forward) call, so that [`truncate`](Self::truncate) and a cancelled
    /// or failed call can go back there exactly. Costs a copy of the states per call (for
    /// Qwen3.6-35B-A3B about 63 MB); nothing without linear-attention layers.
    pub fn set_rollback(&mut self, on: bool) {
        self.rollback = on;
        if !on {
            self.rs_snap = None;
        }
    }

    /// A model with recurrent state at `n` tokens (below `n_past`): the snapshot when it is
    /// at `n`, else the empty context.
    fn back_to(&mut self, n: usize) {
        match self.rs_snap.take() {
            Some((at, snap)) if at == n => {
                RecState::copy_all(&mut self.rs, &snap);
                self.n_past = n;
                self.rs_snap = Some((at, snap));
            }
            _ => self.reset(),
        }
    }

    /// True when some layers carry a recurrent state instead of per-position KV cells, so that
    /// the context can only be cut back by [`reset`](Self::reset) or
    /// [`restore_state`](Self::restore_state).
    pub fn has_recurrent_state(&self) -> bool {
        self.rs.iter().any(Option::is_some)
    }

    /// A copy of the context's state (every layer's keys and values of the tokens in it).
    pub fn save_state(&self) -> KvState {
        KvState {
            n_past: self.n_past,
            layers: self.kv.iter().map(|c| c.prefix(self.n_past)).collect(),
            recurrent: self.rs.clone(),
        }
    }

    /// Put back a state saved from this engine: the context becomes exactly the one saved
    /// (what the positions after it held is never read again).
    pub fn restore_state(&mut self, state: &KvState) -> Result<(), ForwardError> {
        let rs_fits = state.recurrent.len() == self.rs.len()
            && state
                .recurrent
                .iter()
                .zip(&self.rs)
                .all(|(a, b)| match (a, b) {
                    (Some(a), Some(b)) => {
                        a.conv.len() == b.conv.len() && a.ssm.len() == b.ssm.len()
                    }
                    (None, None) => true,
                    _ => false,
                });
        if state.layers.len() != self.kv.len() || state.n_past > self.cfg.n_ctx || !rs_fits {
            return Err(ForwardError::Config(format!(
                "a saved state of {} layers and {} tokens does not fit this engine ({} layers, \
                 context {})",
                state.layers.len(),
                state.n_past,
                self.kv.len(),
                self.cfg.n_ctx
            )));
        }
        for (cache, p) in self.kv.iter_mut().zip(&state.layers) {
            cache.restore(p)?;
        }
        RecState::copy_all(&mut self.rs, &state.recurrent);
        self.n_past = state.n_past;
        self.rs_snap = None;
        if let Some(m) = &mut self.mtp {
            // the head has no hidden states of the restored context: it goes on after it
            // (its keys and values of those positions are whatever it ran there last)
            m.cut(0);
            m.n_past = state.n_past;
        }
        Ok(())
    }

    /// Back to the context of `start` tokens after a failed or cancelled call; when
    /// `state_moved` (some layer ran) and the model has linear-attention states, through the
    /// snapshot of the call's start (or to the empty context without one).
    pub(super) fn rewind(&mut self, start: usize, state_moved: bool) {
        if state_moved && self.has_recurrent_state() {
            self.back_to(start);
        } else {
            self.n_past = start;
        }
    }
}
