use thiserror::Error;

/// Errors of tokenizer construction.
#[derive(Debug, Error)]
pub enum TextError {
    /// A required metadata key is absent.
    #[error("tokenizer metadata: missing key `{0}`")]
    MissingKey(String),
    /// A metadata key has the wrong type or an invalid value.
    #[error("tokenizer metadata: key `{key}`: {reason}")]
    BadKey { key: String, reason: String },
    /// `tokenizer.ggml.model` names a tokenizer type sluice does not implement.
    #[error(
        "unsupported tokenizer model `{0}` (tokenizer.ggml.model); supported: gpt2, llama, gemma4"
    )]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer sluice does not know.
    #[error("unknown pre-tokenizer `{0}` (tokenizer.ggml.pre)")]
    UnknownPre(String),
}
