//! `sluice tokenize`: text to token ids with a model's tokenizer.

use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use gguf::{Gguf, GgufFile, Metadata};
use text::Tokenizer;

use crate::inspect::DEMO_MODEL;

pub struct Options {
    pub model: Option<PathBuf>,
    pub text: Option<String>,
    pub file: Option<PathBuf>,
    pub special: bool,
    pub no_bos: bool,
    pub pieces: bool,
    pub chatml: bool,
    pub system: Option<String>,
    pub no_think: bool,
}

/// A model's metadata (only the header is read), from a file or the built-in demo model.
pub enum ModelMeta {
    File(GgufFile, String),
    Demo(Gguf<'static>),
}

impl ModelMeta {
    pub fn open(path: Option<&Path>) -> Result<ModelMeta> {
        match path {
            // The reader's errors name the file themselves.
            Some(p) => Ok(ModelMeta::File(GgufFile::open(p)?, p.display().to_string())),
            None => Ok(ModelMeta::Demo(
                Gguf::parse(DEMO_MODEL).context("the built-in demo model is malformed")?,
            )),
        }
    }

    pub fn metadata(&self) -> &Metadata {
        match self {
            ModelMeta::File(f, _) => f.metadata(),
            ModelMeta::Demo(g) => g.metadata(),
        }
    }

    /// How errors name the model.
    pub fn name(&self) -> &str {
        match self {
            ModelMeta::File(_, name) => name,
            ModelMeta::Demo(_) => "the built-in demo model",
        }
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Tokenizer::from_metadata(self.metadata())
            .with_context(|| format!("{}: cannot build the tokenizer", self.name()))
    }
}

/// The text to tokenize: the argument, or the file (`-` for standard input).
fn input_text(opts: &Options) -> Result<String> {
    match (&opts.text, &opts.file) {
        (Some(t), None) => Ok(t.clone()),
        (None, Some(path)) => {
            let mut bytes = Vec::new();
            if path == Path::new("-") {
                io::stdin()
                    .read_to_end(&mut bytes)
                    .context("cannot read standard input")?;
            } else {
                bytes = std::fs::read(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
            }
            String::from_utf8(bytes).map_err(|e| {
                anyhow::anyhow!(
                    "{}: not UTF-8 text (invalid byte at offset {})",
                    path.display(),
                    e.utf8_error().valid_up_to()
                )
            })
        }
        (Some(_), Some(_)) => bail!("give the text either as an argument or with --file, not both"),
        (None, None) => bail!("no text to tokenize: give it as an argument or with --file"),
    }
}

pub fn run(opts: &Options) -> Result<()> {
    let text = input_text(opts)?;
    let model = ModelMeta::open(opts.model.as_deref())?;
    let tokenizer = model.tokenizer()?;
    let ids = if opts.chatml {
        // The text is one user message, rendered with the model's own template; the rendering
        // holds special-token text, so it is always parsed, and a BOS the template wrote itself
        // is dropped where the tokenizer adds one (as llama.cpp does).
        let template =
            runtime::prompt::load_template(model.metadata(), &tokenizer, None, model.name())?;
        let format = chat::ChatFormat::new(template);
        let messages = runtime::prompt::single_turn(opts.system.as_deref(), &text);
        let prompt = runtime::prompt::render_prompt(&format, &messages, None, !opts.no_think)?;
        let add_special = !opts.no_bos;
        let rendered = if add_special && tokenizer.vocab().add_bos {
            format.template().strip_leading_bos(&prompt.text)
        } else {
            &prompt.text
        };
        tokenizer.encode(rendered, add_special, true)
    } else {
        tokenizer.encode(&text, !opts.no_bos, opts.special)
    };

    let stdout = io::stdout();
    let mut w = BufWriter::new(stdout.lock());
    if opts.pieces {
        for &id in &ids {
            let piece = tokenizer.token_to_piece(id, true);
            let shown = serde_json::to_string(&String::from_utf8_lossy(&piece))?;
            writeln!(w, "{id}\t{shown}")?;
        }
    } else {
        serde_json::to_writer(&mut w, &ids)?;
        writeln!(w)?;
    }
    w.flush()?;
    Ok(())
}
