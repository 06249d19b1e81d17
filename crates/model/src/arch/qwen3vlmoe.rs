//! Qwen3-VL MoE (`qwen3vlmoe`): the text model of Qwen3-VL-30B-A3B / 235B-A22B, qwen3moe's
//! layer with interleaved multi-section rope (IMRoPE, `rope.dimension_sections`; a text token
//! rotates by its position in the first three sections and by 0 in the fourth, so the pairs
//! of the fourth section stay as they are) over the whole head. Its deepstack layers
//! (`n_deepstack_layers`) add image features to the first layers' outputs; a text prompt has
//! none (llama.cpp adds zeros), and vision input is not supported.

use std::fmt::Write as _;

use crate::error::ModelError;
use crate::kv::Kv;
use crate::model::Model;
use crate::params::HParams;
use crate::tensors::{LayerTensors, Loader};

use super::blocks::{self, LayerRules};
use super::keys::{self, ExpertRules, ExpertWidth, Experts};
use super::{ArchDef, ExpertGating, Features, QkNorm};

/// The architecture.
pub(super) struct Def;
/// Its registration.
pub(super) const ARCH: Def = Def;

/// The key of the deepstack layers' count.
const DEEPSTACK: &str = "n_deepstack_layers";

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "qwen3vlmoe"
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: QkNorm::PerHead,
            imrope: true,
            ..Features::BASE
        }
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        keys::experts(
            kv,
            hp,
            &ExpertRules {
                experts: Experts::Required,
                width: ExpertWidth::KeyOrFfnPerUsed,
                weights_norm: true,
                gating: ExpertGating::Softmax,
                reads_gating_func: false,
            },
        )?;
        keys::imrope_sections(kv, hp)?;
        // read for its type only: text prompts carry no deepstack features
        kv.u32(&kv.key(DEEPSTACK))?;
        Ok(())
    }

    fn layer<'a>(
        &self,
        ld: &mut Loader<'a>,
        hp: &HParams,
        il: usize,
    ) -> Result<LayerTensors<'a>, ModelError> {
        blocks::mha_layer(ld, hp, il, &LayerRules::BASE)
    }

    fn describe(&self, m: &Model<'_>, s: &mut String) {
        let deepstack = m
            .file()
            .metadata()
            .get_u32(&format!("{}.{DEEPSTACK}", self.name()))
            .unwrap_or(0);
        let _ = writeln!(
            s,
            "vision: {deepstack} deepstack layers; text input only (images are not supported), IMRoPE sections {:?}",
            m.hparams.rope.sections
        );
    }
}
