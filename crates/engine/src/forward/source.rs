//! Which experts a MoE layer runs and where their bytes come from: the [`ExpertSource`]
//! trait, the router ([`route`]), a recorded routing replayed ([`RouteReplay`]), the route
//! tap ([`Routed`], [`RouteTap`]), the cache-aware policies' pass over a routing, and the
//! engine's settings of all of these.

use model::HParams;

use super::cache_aware;
use super::weights::{FfnW, MoeW};
use super::{
    CacheAware, CacheAwareCounts, Engine, ForesightTap, ForwardError, Lookahead, Scratch, Stage,
    add_bias, mm,
};
use crate::ops::{self, Gating};

/// What one MoE layer routed for the rows of a batch that reached its FFN: row `j` is the
/// token at context position `first_pos + j` (during a prefill the last layer sees only the
/// rows whose logits are wanted), its experts are `ids[j·k..(j+1)·k]` in the router's rank
/// order (or a replay's order) and `weights` the routing weights applied to them.
#[derive(Debug, Clone, Copy)]
pub struct Routed<'r> {
    /// The layer.
    pub layer: usize,
    /// Context position of the first row.
    pub first_pos: usize,
    /// Experts per row.
    pub k: usize,
    /// Expert ids, row after row.
    pub ids: &'r [usize],
    /// The applied weights, in the same order.
    pub weights: &'r [f32],
    /// The routing came from a [`RouteReplay`], not from the router.
    pub replayed: bool,
    /// Per routing, in the same order: dropped by cache-aware dropping ([`CacheAware`]; its
    /// weight in `weights` is the router's, its expert was not loaded). Empty when no routing
    /// of the batch was dropped.
    pub dropped: &'r [bool],
}

/// Observer of every MoE layer's routing (a route trace).
pub type RouteTap<'a> = Box<dyn FnMut(&Routed<'_>) + Send + 'a>;

/// Routing recorded elsewhere, replayed on decode steps (a diagnostic: it makes a model see
/// another model's expert access pattern). While installed, every forward pass of exactly one
/// token routes each MoE layer to the experts of the next recorded step (in the recorded
/// order), wrapping around after the last; the weights are this model's gating probabilities of
/// those experts, renormalized and scaled as the model does. Passes of several tokens (a
/// prefill) route normally.
#[derive(Debug, Clone)]
pub struct RouteReplay {
    /// `steps[s][layer]`: the experts of layer `layer` at step `s` (empty for layers that are
    /// not recorded).
    pub(super) steps: Vec<Vec<Vec<usize>>>,
    pub(super) next: usize,
}

impl RouteReplay {
    /// A replay of `steps[s][layer]` (expert ids); needs at least one step.
    pub fn new(steps: Vec<Vec<Vec<usize>>>) -> Result<RouteReplay, ForwardError> {
        if steps.is_empty() {
            return Err(ForwardError::Config(
                "a route replay needs at least one step".into(),
            ));
        }
        Ok(RouteReplay { steps, next: 0 })
    }

    /// Recorded steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Never true (a replay has at least one step).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The most experts any recorded layer step routes to.
    pub fn max_experts(&self) -> usize {
        self.steps
            .iter()
            .flat_map(|s| s.iter().map(Vec::len))
            .max()
            .unwrap_or(0)
    }

    /// The step the next single-token pass takes.
    pub fn next_step(&self) -> usize {
        self.next
    }
}

/// A projection of a routed expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertProj {
    Gate,
    Up,
    Down,
}

/// Where routed experts' bytes come from instead of the model's memory map: an expert store
/// that streams them into a bounded cache. For every MoE layer of every forward chunk the
/// engine calls [`load`](Self::load) with the layer's routings, takes each routed expert's
/// bytes with [`part`](Self::part), and calls [`release`](Self::release) when the layer is
/// done. The bytes must be exactly those of the model file's expert tensors, so that the
/// results equal a resident run's bit for bit.
pub trait ExpertSource: Send {
    /// Bytes of one expert's `proj` matrix in `layer` (checked against the model when the
    /// source is installed); `None` when the source has no experts for that layer.
    fn proj_bytes(&self, layer: usize, proj: ExpertProj) -> Option<usize>;
    /// Make the experts of `routed` available: every routing of the layer's batch, token after
    /// token in the router's rank order (repeats included). An error stops the forward pass.
    fn load(&mut self, layer: usize, routed: &[usize]) -> Result<(), String>;
    /// Which expert of `pending` (the layer's routed experts not computed yet) to compute
    /// next: one whose bytes are in, waiting only when none is. The default takes them in
    /// order (every expert is in once [`load`](Self::load) returned). An error stops the
    /// forward pass.
    fn next_ready(&mut self, layer: usize, pending: &[usize]) -> Result<usize, String> {
        let _ = layer;
        pending
            .first()
            .copied()
            .ok_or_else(|| "no expert is pending".to_owned())
    }
    /// The experts of `pending` whose bytes are in now, added to `ready` without waiting (a
    /// one-token pass computes them together; when none is, it waits through
    /// [`next_ready`](Self::next_ready)). The default: all of them (every expert is in once
    /// [`load`](Self::load) returned).
    fn ready_now(
        &mut self,
        layer: usize,
        pending: &[usize],
        ready: &mut Vec<usize>,
    ) -> Result<(), String> {
        let _ = layer;
        ready.extend_from_slice(pending);
        Ok(())
    }
    /// Whether expert `expert` of `layer` is resident now: its bytes in memory, or on their way
    /// without a new read (asked by the cache-aware routing policies before the layer's
    /// [`load`](Self::load); must not change what the source holds). The default: every
    /// expert is.
    fn resident(&self, layer: usize, expert: usize) -> bool {
        let _ = (layer, expert);
        true
    }
    /// The bytes of `proj` of expert `expert` of `layer`, loaded by the last [`load`](Self::load).
    fn part(&self, layer: usize, expert: usize, proj: ExpertProj) -> &[u8];
    /// The layer's batch is done: its experts may be evicted.
    fn release(&mut self, layer: usize);
    /// What MoE layer `layer` is ranked to route, known before its router runs (one-token
    /// passes with a [`Lookahead`] that hints): `ranked`, its top-k in rank order.
    /// `committed`: the layer will route exactly these (route-ahead), else it is a prediction.
    /// Called after the current layer's [`load`](Self::load), before its experts are computed.
    /// The default ignores it.
    fn foresee(&mut self, layer: usize, ranked: &[usize], committed: bool) {
        let _ = (layer, ranked, committed);
    }
    /// The layer's exact routing, known before its attention runs (an architecture whose
    /// router reads the layer's input, [`model::Features::router_reads_layer_input`]): the
    /// source may start what [`load`](Self::load) would now, without waiting for the reads,
    /// so that they go on while the attention computes. Returns true when it took them as the
    /// layer's load (the engine then does not call `load` for the layer and takes the experts
    /// through [`next_ready`](Self::next_ready) / [`ready_now`](Self::ready_now) as ever);
    /// false leaves the load to after the attention. The default: false.
    fn load_early(&mut self, layer: usize, routed: &[usize]) -> Result<bool, String> {
        let _ = (layer, routed);
        Ok(false)
    }
}

/// Where a MoE layer's routing comes from: a replayed step's experts (else the router), and
/// the context position of the chunk's first row that reaches the FFN.
pub(super) struct Routing<'r> {
    pub(super) replayed: Option<&'r [usize]>,
    pub(super) first_pos: usize,
    /// The cache-aware policies, and their counts.
    pub(super) policy: CacheAware,
    pub(super) counts: &'r mut CacheAwareCounts,
    /// A decode step's pass (one token in the whole call), where the policies act unless
    /// told to act on prompts too.
    pub(super) decode: bool,
    /// The source took this layer's routing before the attention
    /// ([`ExpertSource::load_early`]): no second load.
    pub(super) loaded_early: bool,
}

/// The router of layer `st.il` on `s.cur`: each row's experts into `s.ids` and their weights
/// into `s.wts` (`k_used` a row, or a replayed cell's). Returns `k_used`.
pub(super) fn route(
    st: Stage<'_, '_>,
    m: &MoeW<'_>,
    replayed: Option<&[usize]>,
    s: &mut Scratch,
) -> Result<usize, ForwardError> {
    let (hp, il, n, pool) = (st.hp, st.il, st.n, st.pool);
    let x_n = m.n_expert;
    let k_used = replayed.map_or(hp.n_expert_used.at(il) as usize, <[usize]>::len);
    // Gemma 4's router reads its own input (`s.rin`), the experts the normed rows
    let rin = if m.router_own_input { &s.rin } else { &s.cur };
    mm(
        pool,
        &m.router,
        m.router.data,
        rin,
        n,
        &mut s.router,
        &mut s.qbuf,
    )?;
    let gating = Gating::from(hp.expert_gating);
    st.emit("ffn_moe_logits", &s.router[..n * x_n]);
    if let Some(b) = &m.biases {
        add_bias(&mut s.router[..n * x_n], Some(&b.router));
        st.emit("ffn_moe_logits_biased", &s.router[..n * x_n]);
    }
    if let Some(cb) = st.obs {
        let mut probs = Vec::new();
        for t in 0..n {
            let p = ops::gate_probs(&s.router[t * x_n..(t + 1) * x_n], gating, &mut probs);
            s.probs[t * x_n..(t + 1) * x_n].copy_from_slice(p);
        }
        cb("ffn_moe_probs", Some(il), &s.probs[..n * x_n]);
    }
    if k_used > x_n {
        return Err(ForwardError::BadTensor {
            tensor: m.router.name.to_owned(),
            msg: format!("top-{k_used} routing over {x_n} experts"),
        });
    }
    for t in 0..n {
        let span = t * k_used..(t + 1) * k_used;
        let logits = &s.router[t * x_n..(t + 1) * x_n];
        let (norm, scale) = (hp.expert_weights_norm, hp.expert_weights_scale);
        match replayed {
            Some(cell) => {
                s.ids[span.clone()].copy_from_slice(cell);
                ops::route_fixed_into(
                    logits,
                    cell,
                    norm,
                    scale,
                    gating,
                    &mut s.route,
                    &mut s.wts[span],
                );
            }
            None => ops::route_biased_into(
                logits,
                selection(hp, m),
                norm,
                scale,
                gating,
                &mut s.route,
                &mut s.ids[span.clone()],
                &mut s.wts[span],
            ),
        }
    }
    if let Some(cb) = st.obs {
        let ids: Vec<f32> = s.ids[..n * k_used].iter().map(|&i| i as f32).collect();
        cb("ffn_moe_topk", Some(il), &ids);
        cb("ffn_moe_weights", Some(il), &s.wts[..n * k_used]);
    }
    Ok(k_used)
}

/// Each expert's `(row, slot)` uses of the batch's `n` routings into `s.by_expert`, without
/// the dropped ones when `dropping` (then `s.load_ids` lists the rest, for the source).
pub(super) fn group_routings(s: &mut Scratch, n: usize, k_used: usize, dropping: bool) {
    for list in &mut s.by_expert {
        list.clear();
    }
    s.load_ids.clear();
    for t in 0..n {
        for slot in 0..k_used {
            let i = t * k_used + slot;
            if dropping {
                if s.dropped[i] {
                    continue;
                }
                s.load_ids.push(s.ids[i]);
            }
            s.by_expert[s.ids[i]].push((t, slot));
        }
    }
}

/// The cache-aware routing policies ([`CacheAware`]) on the router's routing of the batch:
/// substitution re-ranks a decode step's routing toward resident experts (its weights then the
/// router's for the new set), dropping marks the cold, light routings in `s.dropped`. Both
/// ask `source` what is resident; without one every expert is and nothing changes. Returns
/// whether a routing was dropped.
pub(super) fn cache_aware_routing(
    st: Stage<'_, '_>,
    m: &MoeW<'_>,
    k_used: usize,
    policy: (CacheAware, &mut CacheAwareCounts, bool),
    source: Option<&(dyn ExpertSource + '_)>,
    s: &mut Scratch,
) -> bool {
    let Some(src) = source else {
        return false;
    };
    let (hp, il, n) = (st.hp, st.il, st.n);
    let (cfg, counts, decode) = policy;
    let resident = |e: usize| src.resident(il, e);
    if cfg.substitute > 0.0 && decode {
        let gating = Gating::from(hp.expert_gating);
        let logits = &s.router[..m.n_expert];
        let log_space = cache_aware::scores_of(
            logits,
            selection(hp, m),
            gating,
            &mut s.route,
            &mut s.cache_aware,
        );
        let ids = &mut s.ids[..k_used];
        let moved =
            cache_aware::substitute(&mut s.cache_aware, log_space, cfg.substitute, resident, ids);
        counts.reranked += k_used as u64;
        if moved > 0 {
            counts.substituted += moved as u64;
            let (norm, scale) = (hp.expert_weights_norm, hp.expert_weights_scale);
            ops::route_fixed_into(
                logits,
                &s.ids[..k_used],
                norm,
                scale,
                gating,
                &mut s.route,
                &mut s.wts[..k_used],
            );
        }
    }
    if cfg.drop_frac <= 0.0 || !(decode || cfg.drop_in_prefill) {
        return false;
    }
    s.dropped.clear();
    s.dropped.resize(n * k_used, false);
    let mut dropped = 0;
    for t in 0..n {
        let span = t * k_used..(t + 1) * k_used;
        dropped += cache_aware::drop_cold(
            &s.ids[span.clone()],
            &s.wts[span.clone()],
            cfg.drop_frac,
            resident,
            &mut s.dropped[span],
        );
    }
    counts.drop_examined += (n * k_used) as u64;
    counts.dropped += dropped as u64;
    dropped > 0
}

/// How layer `m`'s router chooses beyond the top-k: its selection bias and the model's expert
/// groups.
pub(crate) fn selection<'m>(hp: &HParams, m: &'m MoeW<'_>) -> ops::Selection<'m> {
    ops::Selection {
        bias: m.sel_bias.as_deref(),
        groups: (hp.n_expert_groups > 1)
            .then_some((hp.n_expert_groups as usize, hp.n_group_used as usize)),
    }
}

/// Removes `ex` from `s.pending`; an expert the source offers that is not pending is its error.
pub(super) fn take_pending(s: &mut Scratch, il: usize, ex: usize) -> Result<(), ForwardError> {
    let Some(at) = s.pending.iter().position(|&p| p == ex) else {
        return Err(ForwardError::Experts(format!(
            "layer {il}: the expert source offered expert {ex}, which is not pending"
        )));
    };
    s.pending.remove(at);
    Ok(())
}

impl<'a> Engine<'a> {
    /// Install (or remove, with `None`) the source of routed experts' bytes. Its expert sizes
    /// must match the model's for every MoE layer.
    pub fn set_expert_source(
        &mut self,
        source: Option<Box<dyn ExpertSource + 'a>>,
    ) -> Result<(), ForwardError> {
        if let Some(src) = &source {
            for (il, lw) in self.w.layers.iter().enumerate() {
                let FfnW::Moe(m) = &lw.ffn else { continue };
                let projs = [
                    (ExpertProj::Gate, m.gate.as_ref()),
                    (ExpertProj::Up, Some(&m.up)),
                    (ExpertProj::Down, Some(&m.down)),
                ];
                // (experts without a gate have none to compare)
                for (proj, mat) in projs.into_iter().filter_map(|(p, m)| Some((p, m?))) {
                    let want = mat.per_expert_bytes();
                    if src.proj_bytes(il, proj) != Some(want) {
                        return Err(ForwardError::Config(format!(
                            "the expert source's {proj:?} experts of layer {il} are {:?} bytes, \
                             the model's {want}",
                            src.proj_bytes(il, proj)
                        )));
                    }
                }
            }
        }
        self.source = source;
        Ok(())
    }

    /// Install the cache-aware routing policies (lossy; see [`CacheAware`]). They ask the
    /// expert source what is resident: without a source every expert is, and nothing changes.
    pub fn set_cache_aware(&mut self, policy: CacheAware) -> Result<(), ForwardError> {
        policy.validate().map_err(ForwardError::Config)?;
        self.cache_aware = policy;
        Ok(())
    }

    /// The cache-aware routing policies in force (all off unless [`Engine::set_cache_aware`]
    /// set them).
    pub fn cache_aware(&self) -> CacheAware {
        self.cache_aware
    }

    /// What the cache-aware policies did since the engine was built.
    pub fn cache_aware_counts(&self) -> CacheAwareCounts {
        self.ca_counts
    }

    /// Rank routers ahead of their layers on one-token passes as `lookahead` says (see
    /// [`Lookahead`]), reporting each MoE layer's routing with those rankings to `tap`.
    /// `route_ahead` must leave at least one MoE layer to commit.
    pub fn set_lookahead(
        &mut self,
        lookahead: Lookahead,
        tap: Option<ForesightTap<'a>>,
    ) -> Result<(), ForwardError> {
        let n = self.moe_layers.len();
        if lookahead.route_ahead > 0 && lookahead.route_ahead >= n {
            return Err(ForwardError::Config(format!(
                "route-ahead {} needs more than {} MoE layers (the model has {n})",
                lookahead.route_ahead, lookahead.route_ahead
            )));
        }
        self.lookahead = lookahead;
        self.foresight_tap = tap;
        Ok(())
    }

    /// Install (or remove) the observer of every MoE layer's routing.
    pub fn set_route_tap(&mut self, tap: Option<RouteTap<'a>>) {
        self.route_tap = tap;
    }

    /// Install (or remove) a routing replay for the single-token passes that follow. Every
    /// recorded step must name, for every MoE layer of the model, between 1 and the model's
    /// expert count of distinct experts that exist.
    pub fn set_route_replay(&mut self, replay: Option<RouteReplay>) -> Result<(), ForwardError> {
        if let Some(r) = &replay {
            let e = self.hp.n_embd as usize;
            let mut k_max = 0;
            for (si, step) in r.steps.iter().enumerate() {
                for (il, lw) in self.w.layers.iter().enumerate() {
                    let FfnW::Moe(m) = &lw.ffn else { continue };
                    let cell = step.get(il).map_or(&[][..], |c| c.as_slice());
                    let bad = |msg: String| {
                        Err(ForwardError::Config(format!(
                            "route replay step {si}, layer {il}: {msg}"
                        )))
                    };
                    if cell.is_empty() {
                        return bad("no experts recorded for this MoE layer".into());
                    }
                    if let Some(&x) = cell.iter().find(|&&x| x >= m.n_expert) {
                        return bad(format!(
                            "expert {x} does not exist ({} experts)",
                            m.n_expert
                        ));
                    }
                    let mut seen = cell.to_vec();
                    seen.sort_unstable();
                    seen.dedup();
                    if seen.len() != cell.len() {
                        return bad("an expert is recorded twice".into());
                    }
                    k_max = k_max.max(cell.len());
                }
            }
            // A replay may use more experts per token than the model does.
            let s = &mut self.s;
            if s.ids.len() < k_max {
                s.ids.resize(k_max, 0);
                s.wts.resize(k_max, 0.0);
            }
            if s.slots.len() < k_max * e {
                s.slots.resize(k_max * e, 0.0);
            }
        }
        self.replay = replay;
        Ok(())
    }

    /// The installed routing replay.
    pub fn route_replay(&self) -> Option<&RouteReplay> {
        self.replay.as_ref()
    }
}
