//! The `sluice` command line.
//!
//! Argument parsing and output only: the work is done by the library crates.

mod inspect;
mod npy;
mod tokenize;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run Mixture-of-Experts language models larger than RAM on CPUs.
#[derive(Parser, Debug)]
#[command(name = "sluice", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show what a GGUF model file holds: architecture, metadata, tensor table.
    ///
    /// The whole header is validated first; a malformed file is reported with the key,
    /// tensor or byte offset at fault. A split model is given by its first shard
    /// (`name-00001-of-0000N.gguf`); the other shards are found next to it.
    Inspect(InspectArgs),
    /// Turn text into token ids with a model's tokenizer (the same ids llama.cpp produces).
    ///
    /// Prints the ids as one JSON array on one line. Only the file's metadata is read, so a
    /// vocabulary-only GGUF works as well as a full model.
    Tokenize(TokenizeArgs),
}

#[derive(clap::Args, Debug)]
struct InspectArgs {
    /// The GGUF file to inspect. Without it, the small demo model built into the binary is
    /// inspected (random weights, qwen3moe layout).
    model: Option<PathBuf>,

    /// Print one JSON document instead of text (arrays summarized the same way).
    #[arg(long)]
    json: bool,

    /// How many leading elements of each metadata array to show (the length is always shown).
    #[arg(long, default_value_t = 8, value_name = "N")]
    array_items: usize,

    /// Dequantize this tensor to float32 and write it to the file given with --out.
    #[arg(long, value_name = "NAME", requires = "out")]
    tensor: Option<String>,

    /// Where --tensor writes its values: a numpy .npy file (little-endian float32, shape in
    /// numpy order, i.e. the GGUF dims reversed).
    #[arg(long, value_name = "FILE.npy", requires = "tensor")]
    out: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct TokenizeArgs {
    /// The text to tokenize (or use --file).
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    text: Option<String>,

    /// The GGUF model (or vocabulary-only) file whose tokenizer to use. Without it, the small
    /// demo model built into the binary is used.
    #[arg(short, long, value_name = "MODEL")]
    model: Option<PathBuf>,

    /// Read the text from this file instead (`-` for standard input); it is used as is,
    /// newlines included.
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,

    /// Turn special-token text such as `<s>` or `<|im_start|>` into that token's id instead of
    /// tokenizing its characters.
    #[arg(long)]
    special: bool,

    /// Do not add the BOS/EOS tokens the model's metadata asks for.
    #[arg(long)]
    no_bos: bool,

    /// Print one line per token instead: the id, a tab, and the token's text as a JSON string
    /// (special tokens shown as their text; bytes that are not valid UTF-8 on their own shown
    /// as U+FFFD).
    #[arg(long)]
    pieces: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&inspect::Options {
            model: args.model,
            json: args.json,
            array_items: args.array_items,
            tensor: args.tensor,
            out: args.out,
        }),
        Command::Tokenize(args) => tokenize::run(&tokenize::Options {
            model: args.model,
            text: args.text,
            file: args.file,
            special: args.special,
            no_bos: args.no_bos,
            pieces: args.pieces,
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("sluice: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// Output piped into `head` is not an error.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
