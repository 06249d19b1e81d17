//! `sluice serve`: binds first (so the dashboard shows the load's progress), loads the model,
//! then runs the engine for the server until the process ends. Diagnostics go to standard
//! error.

use std::net::{SocketAddr, ToSocketAddrs};

use anyhow::{Context, Result, anyhow};
use serde_json::json;

use runtime::open::{Loaded, RunConfig};
use runtime::session::SessionConfig;
use serve::http::Limits;
use serve::hub::preamble_facts;
use serve::{Config, Server};

/// A `sluice serve`.
pub struct Options {
    pub run: RunConfig,
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    pub queue: usize,
    pub max_body: usize,
    pub max_connections: usize,
    pub alias: Option<String>,
    pub n_predict: i64,
    pub system: Option<String>,
    pub no_think: bool,
}

/// `host:port` as one address (the first a name resolves to).
fn address(host: &str, port: u16) -> Result<SocketAddr> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .with_context(|| format!("--host {host}: not an address or a name that resolves"))?
        .next()
        .ok_or_else(|| anyhow!("--host {host}: resolves to no address"))
}

pub fn run(opts: Options) -> Result<()> {
    let model_name = opts.alias.clone().unwrap_or_else(|| {
        opts.run
            .model
            .file_stem()
            .map_or_else(|| "model".to_owned(), |s| s.to_string_lossy().into_owned())
    });
    let addr = address(&opts.host, opts.port)?;
    let server = Server::bind(Config {
        addr,
        api_key: opts.api_key.clone(),
        queue: opts.queue,
        limits: Limits {
            max_body: opts.max_body,
            ..Limits::default()
        },
        max_connections: opts.max_connections.max(1),
        model_name: model_name.clone(),
    })
    .with_context(|| format!("cannot listen on {addr}"))?;
    let addr = server.local_addr();
    let url = if addr.is_ipv6() {
        format!("http://[{}]:{}", addr.ip(), addr.port())
    } else {
        format!("http://{addr}")
    };
    if !addr.ip().is_loopback() {
        eprintln!(
            "sluice serve: listening on {addr}, which is NOT a loopback address: anyone who can \
             reach this machine can use the model{}",
            if opts.api_key.is_some() {
                " (with the API key)"
            } else {
                " (no --api-key is set)"
            }
        );
    }
    // The address is bound and answers (503 to generation requests while loading).
    eprintln!("sluice serve: listening on {url} (dashboard {url}/, OpenAI API {url}/v1)");
    server
        .start()
        .context("cannot start the connection thread")?;

    let hub = std::sync::Arc::clone(server.hub());
    let notices = runtime::Notices::new(move |n| {
        eprintln!("{}", n.text);
        match n.fraction {
            Some(f) => hub.loading(f, &n.text),
            None => hub.loading(0.0, &n.text),
        }
    });
    let loaded = match Loaded::open(&opts.run, &notices) {
        Ok(l) => l,
        Err(e) => {
            let msg = crate::refusal::runtime_error(&e);
            server.hub().failed(&msg);
            return Err(e.into());
        }
    };
    let (mut rt, preamble) = loaded.runtime(&opts.run)?;
    let hp = rt.engine.hparams();
    let info = json!({
        "model": model_name,
        "path": opts.run.model.display().to_string(),
        "arch": rt.arch,
        "n_layer": hp.n_layer,
        "n_expert": hp.n_expert,
        "n_expert_used": hp.n_expert_used.max(),
        "n_ctx": rt.n_ctx,
        "threads": rt.n_threads,
        "streaming": rt.streaming,
        "overlap": rt.overlap,
        "cache_mib": rt.budget_mib(),
        "chat_template": rt.format.is_some(),
        "think_ctl": rt.format.map_or("none", |f| f.think_ctl().as_str()),
        "load_s": rt.load_s,
        "mode": rt.mode,
        "config": preamble_facts(&preamble.record()),
    });
    let mode = rt.mode.clone();
    server.serve(
        &mut rt,
        SessionConfig {
            system: opts.system,
            think: !opts.no_think,
            n_predict: opts.n_predict,
            ..SessionConfig::default()
        },
        info,
        // The line a script waits for: requests are answered from here on.
        || eprintln!("sluice serve: ready ({mode})"),
    );
    Ok(rt.finish()?)
}
