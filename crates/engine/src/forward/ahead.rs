//! Ranking a MoE layer's router before that layer runs (single-token passes only).
//!
//! A layer's routing is a function of the hidden state entering it, which exists only once the
//! layer before has run. Each layer only nudges the residual stream, so a later layer's router
//! applied to an earlier layer's FFN input (the *stale gate*) ranks close to what that later
//! layer will choose. With a [`Lookahead`] installed the engine, on every one-token pass, after
//! a MoE layer's `load`:
//!
//! - ranks the next MoE layer's router on this layer's FFN input ([`Lookahead::stale_gate`]),
//!   handing the ranking to the expert source as a hint ([`Lookahead::hint`],
//!   [`ExpertSource::foresee`](super::ExpertSource::foresee));
//! - ranks this layer's own router on its own input through the same path
//!   ([`Lookahead::control`]): the probe's control, which must reproduce the router's choice;
//! - with [`Lookahead::route_ahead`] `N`, ranks the router of the MoE layer `N` ahead and
//!   *commits* that layer's selection to it (lossy): the layer's experts are the early ranking,
//!   weighted by the layer's own gating probabilities of them, renormalized and scaled as the
//!   model does (as a replayed routing is);
//! - reports the layer's routing with what was ranked for it to a [`ForesightTap`].
//!
//! Nothing here changes a bit of the output unless `route_ahead` is set.

use quant::ThreadPool;

use super::weights::MoeW;
use super::{ForwardError, Stage, mm};
use crate::ops::{self, Gating};
use model::HParams;

/// What the engine ranks ahead of the router on one-token passes; all off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lookahead {
    /// Rank each next MoE layer's router on this layer's FFN input (the stale gate), for the
    /// [`ForesightTap`].
    pub stale_gate: bool,
    /// Also rank each layer's own router on its own input through the same path (a control
    /// that must read 100 % where the selection is a pure ranking of the logits).
    pub control: bool,
    /// Hand the stale gate's ranking of the next MoE layer to the expert source
    /// ([`ExpertSource::foresee`](super::ExpertSource::foresee)) after each layer's `load`.
    pub hint: bool,
    /// Route-ahead (lossy): commit each MoE layer's selection to its router's ranking on the
    /// FFN input of the MoE layer this many before it (0: off). The committed experts are also
    /// handed to the expert source as soon as they are known.
    pub route_ahead: usize,
}

impl Lookahead {
    /// Whether anything is ranked ahead.
    pub fn any(&self) -> bool {
        self.stale_gate || self.control || self.hint || self.route_ahead > 0
    }
}

/// One MoE layer's routing on a one-token pass, with what was ranked for it ahead.
#[derive(Debug, Clone, Copy)]
pub struct Foresight<'r> {
    /// The layer.
    pub layer: usize,
    /// The experts the layer used, in rank order.
    pub used: &'r [usize],
    /// Under route-ahead, when the selection was committed: the router's own top-k (what it
    /// would have chosen).
    pub router: Option<&'r [usize]>,
    /// The stale gate's top-k for this layer, ranked on the previous MoE layer's FFN input in
    /// this pass (`None` for the first MoE layer, or when the stale gate is off).
    pub stale: Option<&'r [usize]>,
    /// The control: this layer's router ranked on its own input through the ranking path.
    pub control: Option<&'r [usize]>,
    /// The selection was committed by route-ahead (else the router's, or a replay's).
    pub committed: bool,
    /// The routing came from a route replay.
    pub replayed: bool,
    /// Time spent ranking ahead at this layer (every GEMV and top-k of it), in nanoseconds.
    pub rank_ns: u64,
}

/// Observer of every MoE layer's routing on one-token passes with what was ranked ahead.
pub type ForesightTap<'a> = Box<dyn FnMut(&Foresight<'_>) + Send + 'a>;

/// Rankings made within the current pass, by layer, and the buffers to make them.
#[derive(Default)]
pub(crate) struct AheadState {
    /// The pass being run has one token (a decode step): only then is anything ranked ahead.
    pub one_token: bool,
    /// The stale gate's top-k for each layer, made at the MoE layer before it (empty: none).
    /// The buffers are kept from pass to pass.
    stale: Vec<Vec<usize>>,
    /// Route-ahead's committed top-k for each layer (empty: none).
    committed: Vec<Vec<usize>>,
    logits: Vec<f32>,
    ids: Vec<usize>,
    wts: Vec<f32>,
    own: Vec<usize>,
    control: Vec<usize>,
    route: ops::RouteScratch,
    qbuf: Vec<u8>,
}

impl AheadState {
    /// Forget the last pass's rankings (a pass that stopped may have left some).
    pub(crate) fn reset(&mut self, n_layer: usize, one_token: bool) {
        self.one_token = one_token;
        for v in [&mut self.stale, &mut self.committed] {
            v.resize_with(n_layer, Vec::new);
            v.iter_mut().for_each(Vec::clear);
        }
    }

    /// Route-ahead's committed selection of `layer` (empty: none), lent out until
    /// [`return_committed`](Self::return_committed).
    pub(crate) fn take_committed(&mut self, layer: usize) -> Vec<usize> {
        self.committed
            .get_mut(layer)
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The buffer [`take_committed`](Self::take_committed) lent out, emptied for reuse.
    pub(crate) fn return_committed(&mut self, layer: usize, mut v: Vec<usize>) {
        v.clear();
        if let Some(slot) = self.committed.get_mut(layer) {
            *slot = v;
        }
    }

    /// Rank router `m` of layer `target` on the one row `x`: its top-k (the model's k at that
    /// layer) into `self.ids` in the router's rank order.
    fn rank(
        &mut self,
        pool: &ThreadPool,
        hp: &HParams,
        m: &MoeW<'_>,
        target: usize,
        x: &[f32],
    ) -> Result<(), ForwardError> {
        let x_n = m.n_expert;
        self.logits.resize(x_n, 0.0);
        mm(
            pool,
            &m.router,
            m.router.data,
            x,
            1,
            &mut self.logits,
            &mut self.qbuf,
        )?;
        if let Some(b) = &m.biases {
            for (l, &bv) in self.logits.iter_mut().zip(&b.router) {
                *l += bv;
            }
        }
        let k = (hp.n_expert_used.at(target) as usize).min(x_n);
        self.ids.resize(k, 0);
        self.wts.resize(k, 0.0);
        let gating = Gating::from(hp.expert_gating);
        ops::route_biased_into(
            &self.logits,
            super::source::selection(hp, m),
            hp.expert_weights_norm,
            hp.expert_weights_scale,
            gating,
            &mut self.route,
            &mut self.ids,
            &mut self.wts,
        );
        Ok(())
    }
}

/// What a layer's stage needs to rank ahead: the configuration, every layer's weights (the
/// routers of later layers), the MoE layers in order, the pass's rankings and the tap.
pub(crate) struct Ahead<'x, 'a> {
    pub cfg: Lookahead,
    pub layers: &'x [super::LayerW<'a>],
    pub moe_layers: &'x [usize],
    pub state: &'x mut AheadState,
    pub tap: &'x mut Option<ForesightTap<'a>>,
}

/// The MoE layer `d` after `il` in the cycle `moe_layers`.
fn moe_after(moe_layers: &[usize], il: usize, d: usize) -> Option<usize> {
    let pos = moe_layers.iter().position(|&l| l == il)?;
    moe_layers.get(pos + d).copied()
}

/// The MoE weights of layer `il`.
fn moe_of<'x, 'a>(layers: &'x [super::LayerW<'a>], il: usize) -> Option<&'x MoeW<'a>> {
    match &layers.get(il)?.ffn {
        super::FfnW::Moe(m) => Some(m),
        super::FfnW::Dense(_) | super::FfnW::None => None,
    }
}

impl Ahead<'_, '_> {
    /// After layer `st.il`'s load on a one-token pass (its FFN input in `cur`, its router's
    /// logits in `router_logits`, the experts it uses in `used`): rank ahead as configured,
    /// hint the source, and report the layer to the tap.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn after_load(
        &mut self,
        st: Stage<'_, '_>,
        m: &MoeW<'_>,
        cur: &[f32],
        router_logits: &[f32],
        used: &[usize],
        committed: bool,
        replayed: bool,
        source: &mut Option<Box<dyn super::ExpertSource + '_>>,
    ) -> Result<(), ForwardError> {
        let (pool, hp, il) = (st.pool, st.hp, st.il);
        let t0 = std::time::Instant::now();
        let x = &cur[..hp.n_embd as usize];
        if committed {
            // What the router itself would have chosen, for the agreement.
            let k = used.len();
            let a = &mut *self.state;
            a.own.resize(k, 0);
            a.wts.resize(k, 0.0);
            ops::route_biased_into(
                &router_logits[..m.n_expert],
                super::source::selection(hp, m),
                hp.expert_weights_norm,
                hp.expert_weights_scale,
                Gating::from(hp.expert_gating),
                &mut a.route,
                &mut a.own,
                &mut a.wts[..k],
            );
        }
        if self.cfg.control {
            self.state.rank(pool, hp, m, il, x)?;
            self.state.control.clone_from(&self.state.ids);
        }
        let (layers, moe_layers) = (self.layers, self.moe_layers);
        if (self.cfg.stale_gate || self.cfg.hint)
            && let Some(t) = moe_after(moe_layers, il, 1)
            && let Some(next) = moe_of(layers, t)
        {
            self.state.rank(pool, hp, next, t, x)?;
            if self.cfg.hint
                && let Some(src) = source
            {
                src.foresee(t, &self.state.ids, false);
            }
            if self.cfg.stale_gate {
                let a = &mut *self.state;
                a.stale[t].clone_from(&a.ids);
            }
        }
        let n_ra = self.cfg.route_ahead;
        if n_ra > 0
            && let Some(t) = moe_after(moe_layers, il, n_ra)
            && let Some(target) = moe_of(layers, t)
        {
            self.state.rank(pool, hp, target, t, x)?;
            if let Some(src) = source {
                src.foresee(t, &self.state.ids, true);
            }
            let a = &mut *self.state;
            a.committed[t].clone_from(&a.ids);
        }
        let rank_ns = t0.elapsed().as_nanos() as u64;
        if let Some(tap) = self.tap {
            let stale = self.state.stale[il].as_slice();
            tap(&Foresight {
                layer: il,
                used,
                router: committed.then_some(self.state.own.as_slice()),
                stale: (!stale.is_empty()).then_some(stale),
                control: self.cfg.control.then_some(self.state.control.as_slice()),
                committed,
                replayed,
                rank_ns,
            });
        }
        self.state.stale[il].clear();
        Ok(())
    }
}
