//! The runtime's API as a server or an app holds it: open a model, make its runtime, keep a
//! chat session, stream an answer through a sink of one's own, and cancel a request from
//! another thread (as a server does when its client goes away).
//!
//!     cargo run --release -p runtime --example chat [MODEL.gguf] ["question"]
//!
//! With no model, the generated MoE test model (`scripts/fetch_moe_fixtures.sh`) is used.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;

use runtime::cancel::{CancelHandle, Control};
use runtime::events::{Outcome, Prefilled, TokenRow};
use runtime::open::{Loaded, RunConfig};
use runtime::session::{ChatRequest, Session, SessionConfig};
use runtime::sink::Sink;
use runtime::{Level, Notices};

/// Prints the answer as it arrives, and what each token cost.
struct Printer;

impl Sink for Printer {
    fn prefilled(&mut self, p: &Prefilled) -> runtime::Result<()> {
        eprintln!(
            "[{} prompt tokens, {} run in {:.3} s]",
            p.n_prompt, p.n_new, p.secs
        );
        Ok(())
    }

    fn delta(&mut self, d: &chat::SplitDelta) -> runtime::Result<()> {
        print!("{}", d.text);
        std::io::stdout().flush()?;
        Ok(())
    }

    fn token(&mut self, row: &TokenRow) -> runtime::Result<()> {
        // One CSV row of the bmoe_metrics format per token (only with token figures on).
        if row.step == 1 {
            eprintln!("[first token: {}]", row.metrics());
        }
        Ok(())
    }

    fn finished(&mut self, o: &Outcome) -> runtime::Result<()> {
        println!();
        eprintln!("[{} tokens, cancelled: {}]", o.summary.tokens, o.cancelled);
        Ok(())
    }
}

/// Tells a "client" thread at the first piece of text, and waits until it has cancelled: the
/// generation then stops before its next forward pass.
struct HangUp {
    said: mpsc::Sender<()>,
    done: mpsc::Receiver<()>,
    told: bool,
}

impl Sink for HangUp {
    fn delta(&mut self, d: &chat::SplitDelta) -> runtime::Result<()> {
        print!("{}", d.text);
        if !self.told {
            self.told = true;
            let _ = self.said.send(());
            let _ = self.done.recv();
        }
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args.next().map(PathBuf::from).unwrap_or_else(|| {
        testdata::fixtures_root()
            .join("moe")
            .join("qwen3moe-q4_k_m.gguf")
    });
    let question = args
        .next()
        .unwrap_or_else(|| "What is a mixture of experts?".into());

    // What the runtime has to say (the stream decision, the prompt's size) arrives here.
    let notices = Notices::new(|n| {
        if n.level != Level::Progress {
            eprintln!("[{}]", n.text);
        }
    });
    let mut cfg = RunConfig::new(model);
    cfg.chatml = true;
    cfg.token_figures = true;
    cfg.history.no_usage = true;
    let loaded = Loaded::open(&cfg, &notices)?;
    let (mut rt, _preamble) = loaded.runtime(&cfg)?;
    let cancel: CancelHandle = Arc::new(Control::new(None, notices.clone()));
    rt.install_control(Arc::clone(&cancel));

    let mut session = Session::new(SessionConfig {
        n_predict: 32,
        ..SessionConfig::default()
    });
    let ask = |prompt: &str, clear_kv: bool| ChatRequest {
        prompt: prompt.into(),
        clear_kv,
        ..ChatRequest::default()
    };

    // Request 1: streamed to the end. A refusal (a prompt too long for the context) would be
    // an error with `is_rejected()`, before anything ran.
    cancel.start(1);
    let accepted = session.accept_chat(&rt, &ask(&question, true))?;
    session.chat(&mut rt, accepted, &mut Printer)?;
    cancel.done();

    // Request 2 continues the chat; a client thread cancels it after its first text.
    let (said_tx, said_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let client = cancel.clone();
    let hang_up = std::thread::spawn(move || {
        if said_rx.recv().is_ok() {
            client.cancel(2);
        }
        let _ = done_tx.send(());
    });
    cancel.start(2);
    let before = session.conversation().len();
    let accepted = session.accept_chat(&rt, &ask("Say more.", false))?;
    let o = session.chat(
        &mut rt,
        accepted,
        &mut HangUp {
            said: said_tx,
            done: done_rx,
            told: false,
        },
    )?;
    cancel.done();
    let _ = hang_up.join();
    println!();
    // Cancelled, the turn is rolled back: the conversation is as it was before it.
    eprintln!(
        "[request 2 cancelled: {}; conversation {} messages before, {} after]",
        o.cancelled,
        before,
        session.conversation().len()
    );
    rt.finish()?;
    Ok(())
}
