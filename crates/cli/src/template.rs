//! `sluice template`: a conversation rendered with the model's own chat template.

use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::{Result, bail};
use chat::{ChatFormat, ReasoningSyntax};

use crate::tokenize::ModelMeta;
use runtime::prompt;

pub struct Options {
    pub model: Option<PathBuf>,
    pub name: Option<String>,
    pub prompt: Option<String>,
    pub system: Option<String>,
    pub messages: Option<PathBuf>,
    pub tools: Option<PathBuf>,
    pub no_think: bool,
    pub no_generation_prompt: bool,
    pub info: bool,
}

pub fn run(opts: &Options) -> Result<()> {
    let model = ModelMeta::open(opts.model.as_deref())?;
    let tokenizer = model.tokenizer()?;
    let template = prompt::load_template(
        model.metadata(),
        &tokenizer,
        opts.name.as_deref(),
        model.name(),
    )?;
    let format = ChatFormat::new(template);

    if opts.info {
        let reasoning = match format.reasoning_syntax() {
            ReasoningSyntax::None => serde_json::json!({"kind": "none"}),
            ReasoningSyntax::Tags { open, close } => {
                serde_json::json!({"kind": "tags", "open": open, "close": close})
            }
            ReasoningSyntax::Harmony => serde_json::json!({"kind": "harmony"}),
        };
        let info = serde_json::json!({
            "think_ctl": format.think_ctl().as_str(),
            "reasoning": reasoning,
        });
        println!("{info}");
        return Ok(());
    }

    let messages = match (&opts.prompt, &opts.messages) {
        (Some(p), None) => prompt::single_turn(opts.system.as_deref(), p),
        (None, Some(path)) => prompt::read_json(path)?,
        _ => bail!("give the conversation with -p PROMPT or --messages FILE.json"),
    };
    let tools = opts.tools.as_deref().map(prompt::read_json).transpose()?;
    let think = !opts.no_think;
    let text = if opts.no_generation_prompt {
        prompt::render_plain(format.template(), &messages, tools.as_ref(), think)?
    } else {
        prompt::render_prompt(&format, &messages, tools.as_ref(), think)?.text
    };
    // Exactly the rendered bytes: no newline is added.
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}
