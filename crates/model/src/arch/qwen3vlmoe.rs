//! Qwen3-VL MoE (`qwen3vlmoe`): the text model of Qwen3-VL-30B-A3B / 235B-A22B, qwen3moe's
//! layer with interleaved multi-section rope (IMRoPE, `rope.dimension_sections`) over the
//! whole head: a text token's position is the same in the first three position streams and 0
//! in the fourth, so a pair the interleaving gives to the fourth stays as it is. Its deepstack layers
//! (`n_deepstack_layers`) add image features to the first layers' outputs; a text prompt has
//! none (llama.cpp adds zeros), and vision input is not supported.

use std::fmt::Write as _;

use crate::error::ModelError;
use crate::kv::Kv;
use crate::model::Model;
use crate::params::HParams;

use super::keys::{self, ExpertRules};
use super::{ArchDef, Features, QkNorm};

/// The architecture.
pub(super) struct Def;

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

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules::QWEN3
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        keys::imrope_sections(kv, hp)?;
        // read for its type only: text prompts carry no deepstack features
        kv.u32(&kv.key(DEEPSTACK))?;
        Ok(())
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
