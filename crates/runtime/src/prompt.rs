//! The model's chat template, as the commands use it: `sluice template` and `--chatml`.

use std::path::Path;

use crate::error::{Context, Result};
use chat::{ChatFormat, ChatTemplate, Data, Prompt, RenderRequest, select_template};
use gguf::Metadata;
use text::Tokenizer;

const TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// The text of a special token (empty when the vocabulary has none), for `bos_token`/`eos_token`.
fn token_text(tokenizer: &Tokenizer, id: Option<u32>) -> String {
    id.and_then(|id| tokenizer.vocab().tokens.get(id as usize))
        .map(|t| t.text.clone())
        .unwrap_or_default()
}

/// The chat template of a model: `tokenizer.chat_template`, or the named
/// `tokenizer.chat_template.<name>` when `name` is given.
pub fn load_template(
    meta: &Metadata,
    tokenizer: &Tokenizer,
    name: Option<&str>,
    model: &str,
) -> Result<ChatTemplate> {
    let named: Vec<(&str, &str)> = meta
        .iter()
        .filter_map(|(key, value)| {
            let name = key.strip_prefix(TEMPLATE_KEY)?.strip_prefix('.')?;
            Some((name, value.as_str()?))
        })
        .collect();
    let source = select_template(meta.get_str(TEMPLATE_KEY), &named, name)
        .with_context(|| format!("{model}: no chat template to use"))?;
    let special = &tokenizer.vocab().special;
    ChatTemplate::new(
        source,
        &token_text(tokenizer, special.bos),
        &token_text(tokenizer, special.eos),
    )
    .with_context(|| format!("{model}: the chat template does not compile"))
}

/// The conversation of one user message, after an optional system message.
pub fn single_turn(system: Option<&str>, user: &str) -> Data {
    let message = |role: &str, content: &str| {
        Data::object([
            ("role", Data::string(role)),
            ("content", Data::string(content)),
        ])
    };
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(message("system", s));
    }
    messages.push(message("user", user));
    Data::array(messages)
}

/// Reads a JSON file (or standard input for `-`) as template data, key order kept.
pub fn read_json(path: &Path) -> Result<Data> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("cannot read standard input")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?
    };
    Data::from_json_str(&text).with_context(|| format!("{}: not valid JSON", path.display()))
}

/// Renders the prompt of a generation with the model's own template; `think` false asks for no
/// reasoning the way the model allows (see `chat::ThinkCtl`).
pub fn render_prompt(
    format: &ChatFormat,
    messages: &Data,
    tools: Option<&Data>,
    think: bool,
) -> Result<Prompt> {
    Ok(format.render_prompt(messages, tools, think, &[])?)
}

/// Renders without the generation prompt (a finished conversation).
pub fn render_plain(
    template: &ChatTemplate,
    messages: &Data,
    tools: Option<&Data>,
    think: bool,
) -> Result<String> {
    let mut req = RenderRequest::new(messages);
    req.tools = tools;
    req.enable_thinking = Some(think);
    Ok(template.render(&req)?)
}

/// The token ids of a rendered chat prompt: special tokens parsed, and a BOS the template
/// wrote itself dropped where the tokenizer adds one (as llama.cpp).
pub fn chat_ids(format: &ChatFormat, tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    let rendered = if tokenizer.vocab().add_bos {
        format.template().strip_leading_bos(text)
    } else {
        text
    };
    tokenizer.encode(rendered, true, true)
}
