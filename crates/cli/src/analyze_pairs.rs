//! `sluice analyze pairs`: the co-activation table `--couple` reads ahead from (store::couple),
//! built from routing traces (`route_trace v1`) or colibri `ROUTE_TRACE` streams, and how well
//! it predicts: the recall of its top-K predictions of each layer's experts from the previous
//! layer's, on the tokens it was not built from, next to the same layer's experts at the
//! previous token.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use telemetry::pairs::{Entry, Pairs};
use telemetry::{Phase, route_stream, route_trace};

#[derive(clap::Args, Debug)]
pub struct PairsArgs {
    /// Routing traces: `route_trace v1` files (`run --route-trace`) or colibri `ROUTE_TRACE`
    /// streams (`run --route-trace-stream`), told apart by their first line.
    #[arg(required = true, value_name = "TRACE")]
    traces: Vec<PathBuf>,

    /// Where to write the table (`# sluice pairs v1`, docs/policy.md).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,

    /// Lookahead: tables for the next MoE layer (1) or the next two (2).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=2))]
    depth: u32,

    /// Followers kept per (layer, expert, lookahead), most likely first.
    #[arg(long, default_value_t = 16, value_name = "N")]
    top: usize,

    /// Build from the first N decode tokens only (every prompt token is used) and measure the
    /// predictions on the decode tokens after them [default: all tokens, measured in-sample].
    #[arg(long, value_name = "N")]
    train_tokens: Option<usize>,
}

/// One token's routing: layer → experts (slot order).
type Token = BTreeMap<u32, Vec<u32>>;

/// The tokens of a trace file, each marked decode or not.
fn read_tokens(path: &Path) -> Result<Vec<(bool, Token)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    if text.starts_with(route_trace::MAGIC) {
        let t = telemetry::read_route_trace(path)?;
        let mut out: Vec<(bool, Token)> = t
            .steps(|p| p == Phase::Prefill, true)
            .into_iter()
            .map(|s| (false, s))
            .collect();
        out.extend(
            t.steps(|p| p == Phase::Decode, true)
                .into_iter()
                .map(|s| (true, s)),
        );
        return Ok(out);
    }
    // A ROUTE_TRACE stream: a forward batch starts where the layer goes back; a one-row batch
    // is a decode step.
    let mut batches: Vec<BTreeMap<u64, Token>> = Vec::new();
    let mut last_layer: Option<u32> = None;
    for r in route_stream::parse(&text, &path.display().to_string())? {
        if last_layer.is_none_or(|l| r.layer < l) || batches.is_empty() {
            batches.push(BTreeMap::new());
        }
        last_layer = Some(r.layer);
        let mut experts = Vec::new();
        for (e, _) in r.experts {
            if !experts.contains(&e) {
                experts.push(e);
            }
        }
        if let Some(b) = batches.last_mut() {
            b.entry(r.row).or_default().insert(r.layer, experts);
        }
    }
    Ok(batches
        .into_iter()
        .flat_map(|b| {
            let decode = b.len() == 1;
            b.into_values().map(move |t| (decode, t))
        })
        .collect())
}

/// Co-activation counts: per (layer, expert, d), tokens and followers.
#[derive(Default)]
struct Counts {
    n: HashMap<(u32, u32, u32), u64>,
    next: HashMap<(u32, u32, u32), HashMap<u32, u64>>,
}

fn count(tokens: &[&Token], order: &[u32], depth: u32) -> Counts {
    let mut c = Counts::default();
    for t in tokens {
        for (i, &l) in order.iter().enumerate() {
            let Some(s) = t.get(&l) else { continue };
            for d in 1..=depth {
                let Some(next) = order.get(i + d as usize).and_then(|nl| t.get(nl)) else {
                    continue;
                };
                for &e in s {
                    *c.n.entry((l, e, d)).or_default() += 1;
                    let f = c.next.entry((l, e, d)).or_default();
                    for &x in next {
                        *f.entry(x).or_default() += 1;
                    }
                }
            }
        }
    }
    c
}

pub fn run(args: PairsArgs) -> Result<()> {
    let mut tokens: Vec<(bool, Token)> = Vec::new();
    for p in &args.traces {
        tokens.extend(read_tokens(p)?);
    }
    let mut order: Vec<u32> = tokens.iter().flat_map(|(_, t)| t.keys().copied()).collect();
    order.sort_unstable();
    order.dedup();
    if order.len() < 2 {
        bail!("the traces route fewer than two MoE layers: no pairs to count");
    }
    let n_expert = tokens
        .iter()
        .flat_map(|(_, t)| t.values().flatten())
        .max()
        .map_or(0, |&e| e + 1);
    // Train on the prompt tokens and the first decode tokens; test on the rest.
    let mut seen_decode = 0usize;
    let (mut train, mut test): (Vec<&Token>, Vec<&Token>) = (Vec::new(), Vec::new());
    for (decode, t) in &tokens {
        let held_out = *decode && args.train_tokens.is_some_and(|n| seen_decode >= n);
        if *decode {
            seen_decode += 1;
        }
        if held_out {
            test.push(t);
        } else {
            train.push(t);
        }
    }
    let c = count(&train, &order, args.depth);
    let mut table = store::Couple::new();
    let mut keys: Vec<&(u32, u32, u32)> = c.n.keys().collect();
    keys.sort_unstable();
    let mut pairs = Pairs {
        head: Some(telemetry::pairs::Head {
            n_layer: order.last().map_or(0, |&l| l + 1),
            n_expert,
            depth: args.depth,
            tokens: train.len() as u64,
        }),
        entries: Vec::with_capacity(keys.len()),
    };
    for &&(l, e, d) in &keys {
        let n = c.n[&(l, e, d)];
        let mut f: Vec<(u32, u64)> = c.next[&(l, e, d)].iter().map(|(&x, &k)| (x, k)).collect();
        f.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        f.truncate(args.top);
        let next: Vec<(u32, f32)> = f
            .into_iter()
            .map(|(x, k)| (x, k as f32 / n as f32))
            .collect();
        // The table predicts from the probabilities as the file rounds them.
        table.insert(
            l,
            e,
            d,
            next.iter()
                .map(|&(x, p)| (x, (p * 1e4).round() / 1e4))
                .collect(),
        );
        pairs.entries.push(Entry {
            layer: l,
            expert: e,
            d,
            count: n,
            next,
        });
    }
    let out = pairs.write();
    std::fs::write(&args.out, &out).with_context(|| format!("writing {}", args.out.display()))?;

    // How well the table predicts, from the file's own rounded probabilities.
    let (eval, what) = if test.is_empty() {
        (&train, "in-sample: the tokens it was built from")
    } else {
        (
            &test,
            "held out: decode tokens after the ones it was built from",
        )
    };
    println!(
        "pairs: {} tokens ({} decode), {} MoE layers, {} entries -> {}",
        train.len(),
        seen_decode.min(args.train_tokens.unwrap_or(usize::MAX)),
        order.len(),
        keys.len(),
        args.out.display()
    );
    println!(
        "recall of each layer's experts on {} tokens ({what}):",
        eval.len()
    );
    println!(
        "{:>4}  {:>22}  {:>22}",
        "K", "from the layer before", "from the token before"
    );
    for k in [6usize, 8, 12, 16] {
        let (mut hit, mut tot, mut hit_prev, mut tot_prev) = (0u64, 0u64, 0u64, 0u64);
        for (ti, t) in eval.iter().enumerate() {
            for w in order.windows(2) {
                let (Some(a), Some(b)) = (t.get(&w[0]), t.get(&w[1])) else {
                    continue;
                };
                let pred = table.predict(w[0], a, 1, k);
                hit += b.iter().filter(|x| pred.contains(x)).count() as u64;
                tot += b.len() as u64;
                // The same layer's experts at the token before (the first K of them: all).
                if ti > 0
                    && let Some(p) = eval[ti - 1].get(&w[1])
                {
                    hit_prev += b
                        .iter()
                        .filter(|x| p.iter().take(k).any(|y| y == *x))
                        .count() as u64;
                    tot_prev += b.len() as u64;
                }
            }
        }
        let pct = |h: u64, t: u64| {
            if t == 0 {
                0.0
            } else {
                100.0 * h as f64 / t as f64
            }
        };
        println!(
            "{k:>4}  {:>21.1}%  {:>21.1}%",
            pct(hit, tot),
            pct(hit_prev, tot_prev)
        );
    }
    Ok(())
}
