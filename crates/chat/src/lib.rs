//! Chat templates, think control and the reasoning/answer split.
//!
//! - [`ChatTemplate`] renders a model's `tokenizer.chat_template` as Hugging Face transformers
//!   does (Jinja2 semantics on minijinja: `trim_blocks`, `lstrip_blocks`, `raise_exception`,
//!   `strftime_now`, a non-escaping `tojson`, Python's text forms of values).
//! - [`ChatFormat`] reads, from renderings of the model's own template, how its reasoning is
//!   delimited and how a `think:false` request is honoured ([`ThinkCtl`]).
//! - [`ReasoningSplitter`] splits generated text into answer and reasoning deltas as it streams.

mod clock;
mod format;
mod pyfmt;
mod reasoning;
mod template;

pub use clock::{Clock, strftime};
pub use format::{ChatFormat, Prompt, ReasoningSyntax, ThinkCtl};
pub use reasoning::{ReasoningSplitter, SplitDelta};
pub use template::{ChatTemplate, Data, RenderRequest, select_template};

/// Errors of this crate.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ChatError {
    /// The model carries no `tokenizer.chat_template`.
    #[error("the model has no chat template (no tokenizer.chat_template in its metadata)")]
    NoTemplate,
    /// A named template was asked for that the model does not have.
    #[error("the model has no chat template named {wanted:?} (it has: {available:?})")]
    UnknownTemplate {
        wanted: String,
        available: Vec<String>,
    },
    /// The template does not parse.
    #[error("chat template syntax error: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`.
    #[error("chat template raised: {0}")]
    Raised(String),
    /// Rendering failed (an undefined attribute, a type error, ...).
    #[error("chat template render error: {0}")]
    Render(String),
    /// Template input that is not valid JSON.
    #[error("invalid template data: {0}")]
    Data(String),
}
