//! Readers of the keys several architectures share: experts, sliding windows, multi-head
//! latent attention, the linear-attention layers of a hybrid stack, IMRoPE's sections.

use gguf::{ArrayValue, Value};

use crate::arch::{ExpertGating, SharedExperts};
use crate::error::ModelError;
use crate::kv::{Kv, invalid, value_type_name};
use crate::params::{HParams, MAX_EXPERTS, Mla, PerLayer, Ssm};

/// Whether an architecture has experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Experts {
    /// Never (a dense architecture).
    Never,
    /// When `expert_count` > 0 (llama, gemma4).
    Optional,
    /// Always: every layer past the leading dense ones (`expert_count` is required).
    Required,
}

/// Where an expert's width comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExpertWidth {
    /// `feed_forward_length` (olmoe, Mixtral-style llama).
    Ffn,
    /// `expert_feed_forward_length`, else `feed_forward_length / expert_used_count` (the
    /// Qwen MoE family).
    KeyOrFfnPerUsed,
    /// `expert_feed_forward_length`, required.
    Key,
}

/// How an architecture reads its expert keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExpertRules {
    /// Whether it has experts.
    pub(crate) experts: Experts,
    /// Where their width comes from.
    pub(crate) width: ExpertWidth,
    /// The default of `expert_weights_norm` (llama.cpp's `norm_w` of the arch's graph).
    pub(crate) weights_norm: bool,
    /// The gating when the file does not say.
    pub(crate) gating: ExpertGating,
    /// True when `expert_gating_func` is read (else the gating is the default).
    pub(crate) reads_gating_func: bool,
    /// True when `expert_gating_func` is required and must name a gating (llama.cpp's
    /// loader requires it, and its graph has no "none" gating): implies reading it.
    pub(crate) gating_func_required: bool,
    /// True when `interleave_moe_layer_step` is required and places the MoE layers (llama4).
    pub(crate) interleaved: bool,
}

impl ExpertRules {
    /// An architecture whose every layer past the leading dense ones has experts, as wide as
    /// `expert_feed_forward_length` (required), routed by a softmax over all of them, not
    /// renormalised: the others state what they change.
    pub(crate) const MOE: ExpertRules = ExpertRules {
        experts: Experts::Required,
        width: ExpertWidth::Key,
        weights_norm: false,
        gating: ExpertGating::Softmax,
        reads_gating_func: false,
        gating_func_required: false,
        interleaved: false,
    };

    /// The Qwen3 MoE family's (qwen3moe, qwen35moe, qwen3vlmoe): experts as wide as
    /// `expert_feed_forward_length`, else `feed_forward_length / expert_used_count`, the top-k
    /// weights renormalised.
    pub(crate) const QWEN3: ExpertRules = ExpertRules {
        width: ExpertWidth::KeyOrFfnPerUsed,
        weights_norm: true,
        ..ExpertRules::MOE
    };

    /// A dense architecture's: `expert_count` must be 0 or absent.
    pub(crate) const DENSE: ExpertRules = ExpertRules {
        experts: Experts::Never,
        width: ExpertWidth::Ffn,
        weights_norm: false,
        gating: ExpertGating::Softmax,
        reads_gating_func: false,
        gating_func_required: false,
        interleaved: false,
    };
}

/// The expert keys: counts, groups, leading dense layers, widths (with the dense FFN widths'
/// check), shared experts and the router's rule.
pub(crate) fn experts(kv: &Kv<'_>, hp: &mut HParams, r: &ExpertRules) -> Result<(), ModelError> {
    counts(kv, hp, r)?;
    let k = |s: &str| kv.key(s);
    let n_layer_dense_lead = kv.u32(&k("leading_dense_block_count"))?.unwrap_or(0);
    if n_layer_dense_lead > hp.n_layer {
        return Err(invalid(
            k("leading_dense_block_count"),
            format!(
                "{n_layer_dense_lead} dense layers but only {} layers",
                hp.n_layer
            ),
        ));
    }
    hp.n_layer_dense_lead = n_layer_dense_lead;
    if r.interleaved {
        let key = k("interleave_moe_layer_step");
        let step = kv.u32_req(&key)?;
        if step == 0 {
            return Err(invalid(
                key,
                "0 would leave every layer without its experts",
            ));
        }
        hp.moe_layer_step = step;
    }
    widths(kv, hp, r)?;
    shared(kv, hp)?;
    let gating_key = k("expert_gating_func");
    if r.gating_func_required {
        match kv.u32(&gating_key)? {
            None => return Err(ModelError::MissingKey(gating_key)),
            Some(0) => {
                return Err(invalid(
                    gating_key,
                    format!(
                        "0 names no gating; {} routes by the function it names",
                        hp.arch
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    let reads = r.reads_gating_func || r.gating_func_required;
    hp.expert_gating = match (reads, kv.u32(&gating_key)?) {
        // 0 is llama.cpp's "none": the arch's default
        (true, Some(v)) if v != 0 => ExpertGating::from_func(v).ok_or_else(|| {
            ModelError::Unsupported(format!(
                "{gating_key} = {v} (supported: 1 softmax, 2 sigmoid)"
            ))
        })?,
        _ => r.gating,
    };
    hp.expert_weights_norm = kv
        .bool(&k("expert_weights_norm"))?
        .unwrap_or(r.weights_norm);
    let scale = kv.f32(&k("expert_weights_scale"))?.unwrap_or(0.0);
    if !scale.is_finite() || scale < 0.0 {
        return Err(invalid(
            k("expert_weights_scale"),
            format!("{scale} is not a finite non-negative number"),
        ));
    }
    hp.expert_weights_scale = scale;
    Ok(())
}

/// For an architecture whose graph always renormalises the top-k weights and never scales
/// them (llama.cpp passes `true` and no scale, whatever the file says): a file that says
/// otherwise is refused rather than run as it does not mean.
pub(crate) fn renormalised_unscaled(kv: &Kv<'_>, hp: &HParams) -> Result<(), ModelError> {
    if !hp.expert_weights_norm {
        return Err(invalid(
            kv.key("expert_weights_norm"),
            "false, but this architecture always renormalises the top-k weights",
        ));
    }
    if hp.expert_weights_scale != 0.0 && hp.expert_weights_scale != 1.0 {
        return Err(invalid(
            kv.key("expert_weights_scale"),
            format!(
                "{}, but this architecture never scales the routing weights",
                hp.expert_weights_scale
            ),
        ));
    }
    Ok(())
}

/// `expert_count`, `expert_used_count` and the expert groups.
fn counts(kv: &Kv<'_>, hp: &mut HParams, r: &ExpertRules) -> Result<(), ModelError> {
    let k = |s: &str| kv.key(s);
    let arch = hp.arch;
    let n_layer_all = hp.n_layer_all();
    let n_expert = kv.u32(&k("expert_count"))?.unwrap_or(0);
    let n_expert_used = kv
        .per_layer(&k("expert_used_count"), n_layer_all)?
        .unwrap_or(PerLayer(vec![0; n_layer_all as usize]));
    let n_expert_groups = kv.u32(&k("expert_group_count"))?.unwrap_or(0);
    let n_group_used = kv.u32(&k("expert_group_used_count"))?.unwrap_or(0);
    if n_expert > MAX_EXPERTS {
        return Err(invalid(
            k("expert_count"),
            format!("{n_expert} experts; at most {MAX_EXPERTS} are supported"),
        ));
    }
    if n_expert > 0 && r.experts == Experts::Never {
        return Err(invalid(
            k("expert_count"),
            format!("{arch} is a dense architecture; {n_expert} experts are not supported"),
        ));
    }
    if n_expert == 0 && r.experts == Experts::Required {
        return match kv.md.get(&k("expert_count")) {
            None => Err(ModelError::MissingKey(k("expert_count"))),
            Some(_) => Err(invalid(
                k("expert_count"),
                format!("must be > 0 for {arch}"),
            )),
        };
    }
    let used_max = n_expert_used.max();
    if used_max > n_expert {
        return Err(invalid(
            k("expert_used_count"),
            format!("{used_max} experts used per token but only {n_expert} exist"),
        ));
    }
    if n_expert > 0 {
        if n_expert_used.as_slice().contains(&0) {
            return Err(invalid(
                k("expert_used_count"),
                format!("must be > 0 in every layer when expert_count is {n_expert}"),
            ));
        }
        groups(kv, n_expert, n_expert_groups, n_group_used)?;
    } else {
        if used_max != 0 {
            return Err(invalid(
                k("expert_used_count"),
                format!("{used_max} experts used per token but expert_count is 0"),
            ));
        }
        if n_expert_groups != 0 {
            return Err(invalid(
                k("expert_group_count"),
                "expert groups without experts (expert_count is 0)",
            ));
        }
    }
    hp.n_expert = n_expert;
    hp.n_expert_used = n_expert_used;
    hp.n_expert_groups = n_expert_groups;
    hp.n_group_used = n_group_used;
    Ok(())
}

/// Group-limited routing's counts (DeepSeek V3's: the best `n_group_used` of `n_groups`).
fn groups(kv: &Kv<'_>, n_expert: u32, n_groups: u32, n_group_used: u32) -> Result<(), ModelError> {
    let k = |s: &str| kv.key(s);
    if n_groups >= n_expert {
        return Err(invalid(
            k("expert_group_count"),
            format!("{n_groups} groups must be fewer than the {n_expert} experts"),
        ));
    }
    if n_groups > 1 {
        if !n_expert.is_multiple_of(n_groups) {
            return Err(invalid(
                k("expert_group_count"),
                format!("{n_expert} experts do not split into {n_groups} groups"),
            ));
        }
        if n_expert / n_groups < 2 {
            return Err(invalid(
                k("expert_group_count"),
                format!("{n_groups} groups of {n_expert} experts leave fewer than 2 in a group"),
            ));
        }
        if n_group_used == 0 || n_group_used >= n_groups {
            return Err(invalid(
                k("expert_group_used_count"),
                format!("{n_group_used} must be in 1..{n_groups}"),
            ));
        }
    }
    Ok(())
}

/// The dense FFN widths' check and each MoE layer's expert width.
fn widths(kv: &Kv<'_>, hp: &mut HParams, r: &ExpertRules) -> Result<(), ModelError> {
    let k = |s: &str| kv.key(s);
    let nl = hp.n_layer_all() as usize;
    let is_moe = |il: usize| hp.stored_layer_has_experts(il);
    for il in 0..nl {
        // (a layer that is its mixer alone has no FFN to be wide)
        if hp.has_no_ffn(il) {
            continue;
        }
        // a dense MLP beside the experts (gemma4) needs its width too
        if (!is_moe(il) || hp.features.mlp_beside_experts) && hp.n_ff.at(il) == 0 {
            return Err(match kv.md.get(&k("feed_forward_length")) {
                None => ModelError::MissingKey(k("feed_forward_length")),
                Some(_) => invalid(
                    k("feed_forward_length"),
                    format!("layer {il} has a dense FFN of width 0"),
                ),
            });
        }
    }
    let key = match r.width {
        ExpertWidth::Ffn => k("feed_forward_length"),
        _ => k("expert_feed_forward_length"),
    };
    let from_key = match r.width {
        ExpertWidth::Ffn => None,
        _ => kv.per_layer(&key, hp.n_layer_all())?,
    };
    let mut n_ff_exp = vec![0u32; nl];
    for (il, slot) in n_ff_exp.iter_mut().enumerate() {
        if !is_moe(il) {
            continue;
        }
        let keyed = from_key.as_ref().map_or(0, |p| p.at(il));
        let w = match r.width {
            ExpertWidth::Ffn => hp.n_ff.at(il),
            ExpertWidth::Key => keyed,
            ExpertWidth::KeyOrFfnPerUsed if keyed != 0 => keyed,
            ExpertWidth::KeyOrFfnPerUsed => hp.n_ff.at(il) / hp.n_expert_used.at(il).max(1),
        };
        if w == 0 {
            // llama.cpp takes no fallback from feed_forward_length where it requires the key
            let no_fallback = r.width == ExpertWidth::Key;
            return Err(
                if kv.md.get(&key).is_none()
                    && (no_fallback || kv.md.get(&k("feed_forward_length")).is_none())
                {
                    ModelError::MissingKey(key)
                } else {
                    invalid(key, format!("layer {il} has experts of width 0"))
                },
            );
        }
        *slot = w;
    }
    hp.n_ff_exp = PerLayer(n_ff_exp);
    Ok(())
}

/// The shared experts' count and width.
fn shared(kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
    let k = |s: &str| kv.key(s);
    let count_key = k("expert_shared_count");
    let (count, width) = match hp.features.shared_experts {
        SharedExperts::None => (0, 0),
        // as wide as each layer's routed experts (HParams::n_ff_shexp_at)
        SharedExperts::One => {
            let nl = hp.n_layer_all() as usize;
            let first_moe = (0..nl).find(|&il| hp.stored_layer_has_experts(il));
            (1, first_moe.map_or(0, |il| hp.n_ff_exp.at(il)))
        }
        SharedExperts::Gated => {
            let w = match kv.u32(&k("expert_shared_feed_forward_length"))? {
                Some(v) if v > 0 => v,
                _ => hp.n_ff.at(0),
            };
            if w == 0 {
                return Err(ModelError::MissingKey(k(
                    "expert_shared_feed_forward_length",
                )));
            }
            if let Some(v) = kv.u32(&count_key)?
                && v != 1
            {
                return Err(invalid(
                    count_key,
                    format!("{} has exactly 1 shared expert, the file says {v}", hp.arch),
                ));
            }
            (1, w)
        }
        SharedExperts::Counted => {
            // llama.cpp requires the key (0: no shared expert)
            let count = kv.u32_req(&count_key)?;
            let nl = hp.n_layer_all() as usize;
            let first_moe = (hp.n_layer_dense_lead as usize).min(nl.saturating_sub(1));
            let w = hp
                .n_ff_exp
                .at(first_moe)
                .checked_mul(count)
                .ok_or_else(|| {
                    invalid(
                        count_key.clone(),
                        format!("{count} shared experts overflow 32 bits of width"),
                    )
                })?;
            (count, w)
        }
        SharedExperts::Keyed => {
            let key = k("expert_shared_feed_forward_length");
            match kv.u32(&key)? {
                None => return Err(ModelError::MissingKey(key)),
                Some(0) => return Err(invalid(key, "a shared expert of width 0")),
                Some(w) => (1, w),
            }
        }
        SharedExperts::CountedKeyed => {
            let count = kv.u32_req(&count_key)?;
            let nl = hp.n_layer_all() as usize;
            let first_moe = (hp.n_layer_dense_lead as usize).min(nl.saturating_sub(1));
            let each = match kv.u32(&k("expert_shared_feed_forward_length"))? {
                Some(v) if v > 0 => v,
                _ => hp.n_ff_exp.at(first_moe),
            };
            let w = each.checked_mul(count).ok_or_else(|| {
                invalid(
                    count_key.clone(),
                    format!("{count} shared experts of {each} overflow 32 bits of width"),
                )
            })?;
            (count, w)
        }
    };
    hp.n_expert_shared = count;
    hp.n_ff_shexp = width;
    Ok(())
}

/// The sliding window and which layers use it, as llama.cpp reads them
/// (`attention.sliding_window`, required; the pattern from
/// `attention.sliding_window_pattern`: an array of one bool per layer, or a period `n` where
/// layer `il` slides when `il % n < n - 1`, 0 meaning every layer). `default_pattern` is the
/// period when the file has none, `None` when the pattern is required.
pub(crate) fn sliding_window(
    kv: &Kv<'_>,
    hp: &mut HParams,
    default_pattern: Option<u32>,
) -> Result<(), ModelError> {
    let n_layer = hp.n_layer_all();
    let nl = n_layer as usize;
    let n_swa = kv.u32_req(&kv.key("attention.sliding_window"))?;
    let pattern_key = kv.key("attention.sliding_window_pattern");
    let layers = match kv.md.get(&pattern_key) {
        Some(Value::Array(ArrayValue::Bool(b))) => {
            if b.len() != nl {
                return Err(ModelError::ArrayLength {
                    key: pattern_key,
                    expected: nl,
                    found: b.len(),
                });
            }
            b.clone()
        }
        Some(Value::Array(a)) => {
            return Err(ModelError::KeyType {
                key: pattern_key,
                expected: "unsigned integer or array of bools",
                found: format!("array of {}", a.elem_type()),
            });
        }
        None if default_pattern.is_none() => return Err(ModelError::MissingKey(pattern_key)),
        _ => {
            let n = kv.u32(&pattern_key)?.or(default_pattern).unwrap_or(0);
            (0..n_layer).map(|il| n == 0 || il % n < n - 1).collect()
        }
    };
    if n_swa > 0 {
        hp.n_swa = n_swa;
        hp.swa_layers = layers;
    }
    Ok(())
}

/// IMRoPE's four sections (`rope.dimension_sections`, required), rotated pairs per position
/// stream.
pub(crate) fn imrope_sections(kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
    let key = kv.key("rope.dimension_sections");
    let Some(Value::Array(a)) = kv.md.get(&key) else {
        return Err(match kv.md.get(&key) {
            None => ModelError::MissingKey(key),
            Some(v) => ModelError::KeyType {
                key,
                expected: "array of 4 integers",
                found: value_type_name(v),
            },
        });
    };
    if a.len() < 4 {
        return Err(ModelError::ArrayLength {
            key,
            expected: 4,
            found: a.len(),
        });
    }
    let mut sections = [0u32; 4];
    for (i, slot) in sections.iter_mut().enumerate() {
        let v = a
            .get(i)
            .and_then(|v| v.as_u64())
            .ok_or_else(|| invalid(key.clone(), format!("element {i} is not an integer")))?;
        *slot =
            u32::try_from(v).map_err(|_| invalid(key.clone(), format!("element {i} is {v}")))?;
    }
    let sum: u64 = sections.iter().map(|&v| u64::from(v)).sum();
    if sum == 0 || 2 * sum > u64::from(hp.head_dim_k) {
        return Err(invalid(
            key,
            format!(
                "sections {sections:?} cover {sum} rotated pairs; must be 1..={}",
                hp.head_dim_k / 2
            ),
        ));
    }
    hp.rope.sections = sections;
    Ok(())
}

/// The linear-attention sizes and the recurrent layers of a hybrid stack, as llama.cpp's
/// qwen35moe loader reads them: `attention.recurrent_layers` (one bool per stored layer) or
/// else every layer but each `full_attention_interval`-th (default 4) of the trunk; NextN
/// layers are never recurrent.
pub(crate) fn hybrid(
    kv: &Kv<'_>,
    n_layer: u32,
    n_layer_all: u32,
) -> Result<(Option<Ssm>, Vec<bool>), ModelError> {
    let k = |s: &str| kv.key(s);
    let nl = n_layer_all as usize;
    let d_conv = kv.u32_req(&k("ssm.conv_kernel"))?;
    let d_inner = kv.u32_req(&k("ssm.inner_size"))?;
    let d_state = kv.u32_req(&k("ssm.state_size"))?;
    let n_v_heads = kv.u32_req(&k("ssm.time_step_rank"))?;
    let n_k_heads = kv.u32_req(&k("ssm.group_count"))?;
    if d_conv < 2 {
        return Err(invalid(
            k("ssm.conv_kernel"),
            format!("{d_conv}; the convolution needs a width of at least 2"),
        ));
    }
    if d_state == 0 || n_k_heads == 0 || n_v_heads == 0 || !n_v_heads.is_multiple_of(n_k_heads) {
        return Err(invalid(
            k("ssm.time_step_rank"),
            format!(
                "{n_v_heads} value heads of {d_state} over {n_k_heads} key heads (ssm.group_count); \
                 need a positive multiple of the key heads and a positive head size"
            ),
        ));
    }
    if d_state.checked_mul(n_v_heads) != Some(d_inner) {
        return Err(invalid(
            k("ssm.inner_size"),
            format!("{d_inner} is not {n_v_heads} value heads x head size {d_state}"),
        ));
    }
    let layers_key = k("attention.recurrent_layers");
    let recurrent = match kv.md.get(&layers_key) {
        Some(Value::Array(ArrayValue::Bool(b))) => {
            if b.len() != nl {
                return Err(ModelError::ArrayLength {
                    key: layers_key,
                    expected: nl,
                    found: b.len(),
                });
            }
            b.iter()
                .enumerate()
                .map(|(il, &r)| r && il < n_layer as usize)
                .collect()
        }
        Some(v) => {
            return Err(ModelError::KeyType {
                key: layers_key,
                expected: "array of bools",
                found: value_type_name(v),
            });
        }
        None => {
            let every = kv.u32(&k("full_attention_interval"))?.unwrap_or(4);
            if every == 0 {
                return Err(invalid(k("full_attention_interval"), "must be > 0"));
            }
            (0..n_layer_all)
                .map(|il| il < n_layer && !(il + 1).is_multiple_of(every))
                .collect()
        }
    };
    Ok((
        Some(Ssm {
            d_conv,
            d_state,
            n_k_heads,
            n_v_heads,
        }),
        recurrent,
    ))
}

/// The MLA dimensions of a deepseek2 file, checked against the cached head sizes
/// (`attention.key_length` / `value_length`) and the kv heads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mla(
    kv: &Kv<'_>,
    n_layer: u32,
    n_vocab: u32,
    head_dim_k: u32,
    head_dim_v: u32,
    n_head: &PerLayer,
    n_head_kv: &PerLayer,
) -> Result<Mla, ModelError> {
    let k = |s: &str| kv.key(s);
    // llama.cpp's "lite" shapes (DeepSeek-V2-Lite, GigaChat3-10B-A1.8B, Kanana-2-30B-A3B)
    // have no low-rank query and it does not read the key for them
    let lite = matches!(n_layer, 26 | 27) || (n_layer == 48 && n_vocab == 128_256);
    let q_lora_rank = if lite {
        0
    } else {
        kv.u32_req(&k("attention.q_lora_rank"))?
    };
    let kv_lora_rank = kv.u32_req(&k("attention.kv_lora_rank"))?;
    if kv_lora_rank == 0 {
        return Err(invalid(k("attention.kv_lora_rank"), "must be > 0"));
    }
    let (k_mla, v_mla) = (
        kv.u32(&k("attention.key_length_mla"))?,
        kv.u32(&k("attention.value_length_mla"))?,
    );
    let absorbed = match (k_mla, v_mla) {
        (Some(a), Some(b)) if a != 0 && b != 0 => true,
        (None | Some(0), None | Some(0)) => false,
        _ => {
            let missing = if k_mla.unwrap_or(0) == 0 {
                "attention.key_length_mla"
            } else {
                "attention.value_length_mla"
            };
            return Err(invalid(
                k(missing),
                "the absorbed MLA form needs both key_length_mla and value_length_mla",
            ));
        }
    };
    let nl = n_head.as_slice().len();
    let m = if absorbed {
        let m = Mla {
            q_lora_rank,
            kv_lora_rank,
            head_dim_k: k_mla.unwrap_or(0),
            head_dim_v: v_mla.unwrap_or(0),
            absorbed,
        };
        if head_dim_v != kv_lora_rank {
            return Err(invalid(
                k("attention.value_length"),
                format!(
                    "{head_dim_v}; the absorbed MLA form caches the compressed row (kv_lora_rank {kv_lora_rank}) as the value"
                ),
            ));
        }
        if let Some(il) = (0..nl).find(|&il| n_head_kv.at(il) != 1) {
            return Err(invalid(
                k("attention.head_count_kv"),
                format!(
                    "layer {il} has {} kv heads; the absorbed MLA form has one",
                    n_head_kv.at(il)
                ),
            ));
        }
        m
    } else {
        if let Some(il) = (0..nl).find(|&il| n_head_kv.at(il) != n_head.at(il)) {
            return Err(invalid(
                k("attention.head_count_kv"),
                format!(
                    "layer {il} has {} kv heads for {} heads; legacy MLA (attn_kv_b) expands one per head",
                    n_head_kv.at(il),
                    n_head.at(il)
                ),
            ));
        }
        Mla {
            q_lora_rank,
            kv_lora_rank,
            head_dim_k,
            head_dim_v,
            absorbed,
        }
    };
    if m.head_dim_v == 0 {
        return Err(invalid(k("attention.value_length_mla"), "head size is 0"));
    }
    Ok(m)
}
