//! Where each routed expert's bytes are: discovered from the tensor table.

use std::collections::BTreeMap;

use gguf::{GgmlType, GgufFile, Metadata, TensorInfo, TensorType};

use crate::StoreError;

/// One projection (or bias) of an expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PartKind {
    /// `ffn_gate_exps.weight`.
    Gate,
    /// `ffn_up_exps.weight`.
    Up,
    /// `ffn_gate_up_exps.weight`: gate and up fused in one matrix.
    GateUp,
    /// `ffn_down_exps.weight`.
    Down,
    /// `ffn_gate_exps.bias`.
    GateBias,
    /// `ffn_up_exps.bias`.
    UpBias,
    /// `ffn_gate_up_exps.bias`.
    GateUpBias,
    /// `ffn_down_exps.bias`.
    DownBias,
}

impl PartKind {
    /// Every kind, with its tensor name inside a layer (`blk.N.<name>`).
    const ALL: [(PartKind, &'static str); 8] = [
        (PartKind::Gate, "ffn_gate_exps.weight"),
        (PartKind::Up, "ffn_up_exps.weight"),
        (PartKind::GateUp, "ffn_gate_up_exps.weight"),
        (PartKind::Down, "ffn_down_exps.weight"),
        (PartKind::GateBias, "ffn_gate_exps.bias"),
        (PartKind::UpBias, "ffn_up_exps.bias"),
        (PartKind::GateUpBias, "ffn_gate_up_exps.bias"),
        (PartKind::DownBias, "ffn_down_exps.bias"),
    ];

    /// A short name: `gate`, `up`, `gate_up`, `down`, or one of those with ` bias`.
    pub fn name(self) -> &'static str {
        match self {
            PartKind::Gate => "gate",
            PartKind::Up => "up",
            PartKind::GateUp => "gate_up",
            PartKind::Down => "down",
            PartKind::GateBias => "gate bias",
            PartKind::UpBias => "up bias",
            PartKind::GateUpBias => "gate_up bias",
            PartKind::DownBias => "down bias",
        }
    }

    /// The tensor name inside a layer.
    pub fn tensor_suffix(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(k, _)| *k == self)
            .map_or("", |(_, n)| n)
    }

    /// True for the bias parts.
    pub fn is_bias(self) -> bool {
        matches!(
            self,
            PartKind::GateBias | PartKind::UpBias | PartKind::GateUpBias | PartKind::DownBias
        )
    }

    /// The weight a bias belongs to.
    fn weight(self) -> PartKind {
        match self {
            PartKind::GateBias => PartKind::Gate,
            PartKind::UpBias => PartKind::Up,
            PartKind::GateUpBias => PartKind::GateUp,
            PartKind::DownBias => PartKind::Down,
            w => w,
        }
    }
}

/// One expert tensor of a layer: `n_expert` experts of `stride` bytes back to back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertPart {
    pub kind: PartKind,
    /// The tensor's name.
    pub tensor: String,
    /// The shard (file) of a split model holding it; 0 for a single file.
    pub shard: usize,
    /// Absolute offset of expert 0's bytes in that file.
    pub offset: u64,
    /// Bytes of one expert (the distance between consecutive experts).
    pub stride: u64,
    pub ty: GgmlType,
    /// The tensor's dimensions in ggml order; the last is the expert count.
    pub dims: Vec<u64>,
}

impl ExpertPart {
    /// Absolute file offset of expert `e`'s bytes.
    pub fn expert_offset(&self, e: u32) -> u64 {
        self.offset + u64::from(e) * self.stride
    }
}

/// How a layer stores gate and up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fusion {
    /// Separate `ffn_gate_exps` and `ffn_up_exps`.
    Split,
    /// One `ffn_gate_up_exps`.
    Fused,
    /// `ffn_up_exps` alone: experts without a gate (Nemotron-H's ReLU² experts).
    Ungated,
}

/// The experts of one MoE layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerExperts {
    pub layer: u32,
    pub fusion: Fusion,
    /// The expert tensors, weights first (gate, up or gate-up, down), then biases.
    pub parts: Vec<ExpertPart>,
    /// Bytes of one expert: the sum of its parts' strides (what a cache slot holds and a miss
    /// reads).
    pub expert_bytes: u64,
    /// Bytes of the layer's other tensors (attention, norms, router, shared experts).
    pub dense_bytes: u64,
}

impl LayerExperts {
    /// Bytes of a cache slot of this layer: each part's window, widened to whole
    /// [`SLOT_ALIGN`](crate::cache::SLOT_ALIGN) blocks at the worst alignment of any expert.
    pub fn slot_bytes(&self) -> u64 {
        let align = crate::cache::SLOT_ALIGN as u64;
        self.parts
            .iter()
            .map(|p| p.stride.next_multiple_of(align) + align)
            .sum()
    }
}

/// Where every routed expert of a model is; see the [crate docs](crate).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertLayout {
    /// Experts per MoE layer (`<arch>.expert_count`).
    pub n_expert: u32,
    /// Experts routed per token (`<arch>.expert_used_count`).
    pub n_expert_used: u32,
    /// The MoE layers, by layer index (dense layers are absent).
    pub layers: Vec<LayerExperts>,
    /// Bytes of every tensor that is not a routed expert (what stays resident), NextN layers
    /// aside.
    pub dense_bytes: u64,
    /// The tensors of the NextN (multi-token prediction) layers stored after the trunk
    /// (`<arch>.nextn_predict_layers` of the `<arch>.block_count` layers): never run by
    /// decoding, so neither streamed nor kept resident.
    pub nextn_tensors: Vec<String>,
    /// Their bytes.
    pub nextn_bytes: u64,
}

/// `blk.N.rest` → (N, rest).
fn split_layer(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (n, rest) = rest.split_once('.')?;
    Some((n.parse().ok()?, rest))
}

fn meta_u32(meta: &Metadata, key: &str) -> Option<u32> {
    match meta.get(key)? {
        gguf::Value::Array(a) => a.get(0).and_then(|v| v.as_u64()),
        v => v.as_u64(),
    }
    .and_then(|v| u32::try_from(v).ok())
}

impl ExpertLayout {
    /// The layout of a model file (a split model: all its shards); `None` for a model without
    /// routed experts.
    pub fn from_gguf(file: &GgufFile) -> Result<Option<ExpertLayout>, StoreError> {
        ExpertLayout::new(file.metadata(), file.tensors(), |t| {
            file.tensor_file_offset(t)
        })
    }

    /// The layout from a model's metadata and tensor table; `file_offset` gives a tensor's
    /// absolute offset in its shard. `None` for a model without routed experts.
    pub fn new(
        meta: &Metadata,
        tensors: &[TensorInfo],
        file_offset: impl Fn(&TensorInfo) -> Option<u64>,
    ) -> Result<Option<ExpertLayout>, StoreError> {
        let mut by_layer: BTreeMap<u32, Vec<(PartKind, &TensorInfo)>> = BTreeMap::new();
        let mut dense_in_layer: BTreeMap<u32, u64> = BTreeMap::new();
        let mut dense_bytes = 0u64;
        let arch = meta.get_str("general.architecture").unwrap_or("");
        let key = |k: &str| format!("{arch}.{k}");
        // The first NextN layer, if the file declares any.
        let nextn_from = match (
            meta_u32(meta, &key("block_count")),
            meta_u32(meta, &key("nextn_predict_layers")),
        ) {
            (Some(all), Some(n)) if n > 0 && n < all => Some(all - n),
            _ => None,
        };
        let mut nextn_tensors = Vec::new();
        let mut nextn_bytes = 0u64;
        for t in tensors {
            let bytes = t.n_bytes.unwrap_or(0);
            if let (Some(from), Some((l, _))) = (nextn_from, split_layer(&t.name))
                && l >= from
            {
                nextn_tensors.push(t.name.clone());
                nextn_bytes += bytes;
                continue;
            }
            let kind = split_layer(&t.name).and_then(|(l, rest)| {
                PartKind::ALL
                    .iter()
                    .find(|(_, suffix)| *suffix == rest)
                    .map(|&(k, _)| (l, k))
            });
            match kind {
                Some((l, k)) => by_layer.entry(l).or_default().push((k, t)),
                None => {
                    dense_bytes += bytes;
                    if let Some((l, _)) = split_layer(&t.name) {
                        *dense_in_layer.entry(l).or_default() += bytes;
                    }
                }
            }
        }
        if by_layer.is_empty() {
            return Ok(None);
        }
        let n_expert = meta_u32(meta, &key("expert_count"))
            .filter(|&n| n > 0)
            .ok_or_else(|| StoreError::MissingKey {
                key: key("expert_count"),
            })?;
        let n_expert_used = meta_u32(meta, &key("expert_used_count"))
            .filter(|&k| k > 0 && k <= n_expert)
            .ok_or_else(|| StoreError::MissingKey {
                key: key("expert_used_count"),
            })?;

        let mut layers = Vec::with_capacity(by_layer.len());
        for (layer, mut found) in by_layer {
            found.sort_by_key(|(k, _)| *k);
            let has = |k: PartKind| found.iter().any(|(f, _)| *f == k);
            let incomplete = |msg: String| StoreError::IncompleteLayer { layer, msg };
            let fusion = match (
                has(PartKind::Gate),
                has(PartKind::Up),
                has(PartKind::GateUp),
            ) {
                (true, true, false) => Fusion::Split,
                (false, false, true) => Fusion::Fused,
                (false, true, false) => Fusion::Ungated,
                (_, _, true) => {
                    return Err(incomplete(
                        "both a fused ffn_gate_up_exps and separate gate/up expert tensors".into(),
                    ));
                }
                (g, _, _) => {
                    let missing = if g {
                        "ffn_up_exps.weight"
                    } else {
                        "ffn_gate_exps.weight"
                    };
                    return Err(incomplete(format!(
                        "expert tensors without blk.{layer}.{missing}"
                    )));
                }
            };
            if !has(PartKind::Down) {
                return Err(incomplete(format!(
                    "expert tensors without blk.{layer}.ffn_down_exps.weight"
                )));
            }
            let mut parts = Vec::with_capacity(found.len());
            for &(kind, t) in &found {
                if kind.is_bias() && !has(kind.weight()) {
                    return Err(incomplete(format!(
                        "{} without its weight {}",
                        t.name,
                        kind.weight().tensor_suffix()
                    )));
                }
                parts.push(part(kind, t, n_expert, &file_offset)?);
            }
            let expert_bytes = parts.iter().map(|p| p.stride).sum();
            layers.push(LayerExperts {
                layer,
                fusion,
                parts,
                expert_bytes,
                dense_bytes: dense_in_layer.get(&layer).copied().unwrap_or(0),
            });
        }
        Ok(Some(ExpertLayout {
            n_expert,
            n_expert_used,
            layers,
            dense_bytes,
            nextn_tensors,
            nextn_bytes,
        }))
    }

    /// The layout with the experts' bias tensors moved to the dense side: an engine that keeps
    /// the (small) biases resident streams only the weight matrices, so the slots, the token
    /// cycle and the reads count only those, and the biases are loaded with the dense weights.
    pub fn without_biases(mut self) -> ExpertLayout {
        for l in &mut self.layers {
            let moved: u64 = l
                .parts
                .iter()
                .filter(|p| p.kind.is_bias())
                .map(|p| p.stride * u64::from(self.n_expert))
                .sum();
            l.parts.retain(|p| !p.kind.is_bias());
            l.expert_bytes = l.parts.iter().map(|p| p.stride).sum();
            l.dense_bytes += moved;
            self.dense_bytes += moved;
        }
        self
    }

    /// The experts of `layer`, if it is a MoE layer.
    pub fn layer(&self, layer: u32) -> Option<&LayerExperts> {
        self.layers.iter().find(|l| l.layer == layer)
    }

    /// Bytes of all routed experts of all layers.
    pub fn expert_bytes_total(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| l.expert_bytes * u64::from(self.n_expert))
            .sum()
    }

    /// Bytes of cache slots for every routed expert of every layer (what a cache holding all of
    /// them takes: each part's window is padded for aligned reads, [`LayerExperts::slot_bytes`]).
    pub fn slot_bytes_total(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| l.slot_bytes() * u64::from(self.n_expert))
            .sum()
    }

    /// One token cycle in cache slots: `n_expert_used × Σ_layers slot_bytes`.
    pub fn token_cycle_slot_bytes(&self) -> u64 {
        u64::from(self.n_expert_used) * self.layers.iter().map(|l| l.slot_bytes()).sum::<u64>()
    }

    /// One token cycle: what a token reads when none of its experts is cached,
    /// `n_expert_used × Σ_layers expert_bytes`. An LRU cache smaller than this keeps nothing
    /// from one token to the next.
    pub fn token_cycle_bytes(&self) -> u64 {
        u64::from(self.n_expert_used) * self.layers.iter().map(|l| l.expert_bytes).sum::<u64>()
    }
}

fn part(
    kind: PartKind,
    t: &TensorInfo,
    n_expert: u32,
    file_offset: &impl Fn(&TensorInfo) -> Option<u64>,
) -> Result<ExpertPart, StoreError> {
    let bad = |msg: String| StoreError::BadTensor {
        tensor: t.name.clone(),
        msg,
    };
    let TensorType::Known(ty) = t.ty else {
        return Err(bad(format!("unknown type id {}", t.ty.id())));
    };
    let want_dims = if kind.is_bias() { 2 } else { 3 };
    if t.dims.len() != want_dims || t.dims.last() != Some(&u64::from(n_expert)) {
        return Err(bad(format!(
            "shape {:?}: expected {want_dims} dimensions, the last the expert count {n_expert}",
            t.dims
        )));
    }
    let bytes = t
        .n_bytes
        .ok_or_else(|| bad("no size (unknown type)".into()))?;
    if bytes == 0 || bytes % u64::from(n_expert) != 0 {
        return Err(bad(format!(
            "{bytes} bytes do not split into {n_expert} equal experts"
        )));
    }
    let offset = file_offset(t).ok_or_else(|| bad("no file offset (missing shard)".into()))?;
    Ok(ExpertPart {
        kind,
        tensor: t.name.clone(),
        shard: t.shard,
        offset,
        stride: bytes / u64::from(n_expert),
        ty,
        dims: t.dims.clone(),
    })
}
