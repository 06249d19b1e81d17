//! `sluice tokenize`: text to token ids with a model's tokenizer.

use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use gguf::{Gguf, GgufFile};
use text::Tokenizer;

use crate::inspect::DEMO_MODEL;

pub struct Options {
    pub model: Option<PathBuf>,
    pub text: Option<String>,
    pub file: Option<PathBuf>,
    pub special: bool,
    pub no_bos: bool,
    pub pieces: bool,
}

/// Builds the tokenizer of a model file (only its metadata is read), or of the built-in demo
/// model.
fn load_tokenizer(path: Option<&Path>) -> Result<Tokenizer> {
    match path {
        Some(p) => {
            // The reader's errors name the file themselves.
            let file = GgufFile::open(p)?;
            Tokenizer::from_metadata(file.metadata())
                .with_context(|| format!("{}: cannot build the tokenizer", p.display()))
        }
        None => {
            let g = Gguf::parse(DEMO_MODEL).context("the built-in demo model is malformed")?;
            Tokenizer::from_metadata(g.metadata())
                .context("the built-in demo model: cannot build the tokenizer")
        }
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
    let tokenizer = load_tokenizer(opts.model.as_deref())?;
    let ids = tokenizer.encode(&text, !opts.no_bos, opts.special);

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
