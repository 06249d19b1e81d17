//! The `sluice` command line.
//!
//! Argument parsing and output only: the work is done by the library crates.

mod inspect;
mod npy;

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
