//! The `sluice pairs v1` format: the co-activation table `sluice analyze pairs` writes and
//! `--couple` reads ahead from (`store::couple`; docs/policy.md).
//!
//! ```text
//! # sluice pairs v1
//! # n_layer=48 n_expert=128 depth=2 tokens=156
//! <layer> <expert> <d> <count> <next>:<p> <next>:<p> ...
//! ```
//!
//! One entry per line; `#` lines are comments (the second line, which states the table's
//! shape, among them). `count` is how many tokens routed `expert` in `layer` (with a layer `d`
//! MoE layers on), and each `<next>:<p>` the share of them that routed `next` there, most likely
//! first, written with 4 decimals.

use std::fmt::Write as _;

use crate::route_trace::key_values;

/// The first line of a pairs file.
pub const MAGIC: &str = "# sluice pairs v1";

/// The table's shape, from its `# n_layer=` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// One more than the last MoE layer routed.
    pub n_layer: u32,
    /// One more than the largest expert id routed.
    pub n_expert: u32,
    /// The largest lookahead counted.
    pub depth: u32,
    /// Tokens the table was built from.
    pub tokens: u64,
}

/// One entry: the experts that followed `expert` of `layer`, `d` MoE layers on.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub layer: u32,
    pub expert: u32,
    /// Lookahead: 1 the next MoE layer, 2 the one after.
    pub d: u32,
    /// Tokens that routed `expert` in `layer` (with a layer `d` on).
    pub count: u64,
    /// (next expert, share of the `count` tokens that routed it), most likely first.
    pub next: Vec<(u32, f32)>,
}

/// A pairs file.
#[derive(Clone, Debug, PartialEq)]
pub struct Pairs {
    /// The `# n_layer=` line, when the file has one with every key.
    pub head: Option<Head>,
    pub entries: Vec<Entry>,
}

/// What is wrong with a pairs file's text: the 1-based line and the problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{line}: {msg}")]
pub struct PairsError {
    pub line: usize,
    pub msg: String,
}

impl Entry {
    /// Appends the entry's line (with its newline) to `out`.
    pub fn write(&self, out: &mut String) {
        let _ = write!(
            out,
            "{} {} {} {}",
            self.layer, self.expert, self.d, self.count
        );
        for (x, p) in &self.next {
            let _ = write!(out, " {x}:{p:.4}");
        }
        out.push('\n');
    }
}

impl Pairs {
    /// The file's text.
    pub fn write(&self) -> String {
        let mut out = format!("{MAGIC}\n");
        if let Some(h) = &self.head {
            let _ = writeln!(
                out,
                "# n_layer={} n_expert={} depth={} tokens={}",
                h.n_layer, h.n_expert, h.depth, h.tokens
            );
        }
        for e in &self.entries {
            e.write(&mut out);
        }
        out
    }

    /// Parses a pairs file's text.
    pub fn parse(text: &str) -> Result<Pairs, PairsError> {
        let err = |line: usize, msg: String| PairsError { line, msg };
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, l)) if l.trim_end() == MAGIC => {}
            _ => return Err(err(1, format!("expected `{MAGIC}`"))),
        }
        let mut pairs = Pairs {
            head: None,
            entries: Vec::new(),
        };
        for (i, line) in lines {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                if pairs.head.is_none() && pairs.entries.is_empty() {
                    pairs.head = head(comment);
                }
                continue;
            }
            let mut f = line.split_whitespace();
            let mut field = |what: &str| f.next().ok_or_else(|| err(n, format!("missing {what}")));
            let layer: u32 = int(n, "layer", field("layer")?)?;
            let expert: u32 = int(n, "expert", field("expert")?)?;
            let d: u32 = int(n, "d", field("d")?)?;
            let count: u64 = int(n, "count", field("count")?)?;
            if d == 0 {
                return Err(err(n, "d: expected 1 or more".into()));
            }
            let mut next = Vec::new();
            for cell in f {
                let bad = || {
                    err(
                        n,
                        format!("expected <expert>:<probability>, found `{cell}`"),
                    )
                };
                let (e, p) = cell.split_once(':').ok_or_else(bad)?;
                let e: u32 = e.parse().map_err(|_| bad())?;
                let p: f32 = p.parse().map_err(|_| bad())?;
                if !(0.0..=1.0).contains(&p) {
                    return Err(bad());
                }
                next.push((e, p));
            }
            pairs.entries.push(Entry {
                layer,
                expert,
                d,
                count,
                next,
            });
        }
        Ok(pairs)
    }
}

/// Field `what` of line `n`, an integer.
fn int<T: std::str::FromStr>(n: usize, what: &str, t: &str) -> Result<T, PairsError> {
    t.parse().map_err(|_| PairsError {
        line: n,
        msg: format!("{what}: expected an integer, found `{t}`"),
    })
}

/// The shape of a `# n_layer= n_expert= depth= tokens=` comment, if it states all four.
fn head(comment: &str) -> Option<Head> {
    let pairs = key_values(comment);
    let get = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    };
    Some(Head {
        n_layer: get("n_layer")?.parse().ok()?,
        n_expert: get("n_expert")?.parse().ok()?,
        depth: get("depth")?.parse().ok()?,
        tokens: get("tokens")?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry() -> impl Strategy<Value = Entry> {
        (
            (any::<u32>(), any::<u32>(), 1u32..4, any::<u64>()),
            proptest::collection::vec((any::<u32>(), 0u32..=10_000), 0..8),
        )
            .prop_map(|((layer, expert, d, count), next)| Entry {
                layer,
                expert,
                d,
                count,
                // shares that 4 decimals hold exactly
                next: next.into_iter().map(|(x, p)| (x, p as f32 / 1e4)).collect(),
            })
    }

    fn pairs() -> impl Strategy<Value = Pairs> {
        (
            proptest::option::of((any::<u32>(), any::<u32>(), any::<u32>(), any::<u64>())),
            proptest::collection::vec(entry(), 0..12),
        )
            .prop_map(|(head, entries)| Pairs {
                head: head.map(|(n_layer, n_expert, depth, tokens)| Head {
                    n_layer,
                    n_expert,
                    depth,
                    tokens,
                }),
                entries,
            })
    }

    proptest! {
        #[test]
        fn written_tables_parse_back_equal(p in pairs()) {
            prop_assert_eq!(Pairs::parse(&p.write()).expect("parses"), p);
        }

        #[test]
        fn parsed_text_writes_back_identical(p in pairs()) {
            let text = p.write();
            prop_assert_eq!(Pairs::parse(&text).expect("parses").write(), text);
        }
    }

    #[test]
    fn a_table_is_written_as_documented() {
        let p = Pairs {
            head: Some(Head {
                n_layer: 2,
                n_expert: 8,
                depth: 1,
                tokens: 10,
            }),
            entries: vec![Entry {
                layer: 0,
                expert: 1,
                d: 1,
                count: 10,
                next: vec![(3, 0.9), (4, 0.123_45)],
            }],
        };
        assert_eq!(
            p.write(),
            "# sluice pairs v1\n# n_layer=2 n_expert=8 depth=1 tokens=10\n0 1 1 10 3:0.9000 4:0.1235\n"
        );
    }

    #[test]
    fn errors_carry_the_line() {
        for (bad, line, msg) in [
            ("0 1 1 10 3:0.9\n", 1, "expected `# sluice pairs v1`"),
            ("# sluice pairs v1\n0 1 1\n", 2, "missing count"),
            (
                "# sluice pairs v1\n0 x 1 3\n",
                2,
                "expert: expected an integer, found `x`",
            ),
            (
                "# sluice pairs v1\n0 1 0 3 2:0.5\n",
                2,
                "d: expected 1 or more",
            ),
            (
                "# sluice pairs v1\n0 1 1 3 2:1.5\n",
                2,
                "expected <expert>:<probability>, found `2:1.5`",
            ),
            (
                "# sluice pairs v1\n\n0 1 1 3 2-0.5\n",
                3,
                "expected <expert>:<probability>, found `2-0.5`",
            ),
        ] {
            let e = Pairs::parse(bad).unwrap_err();
            assert_eq!((e.line, e.msg.as_str()), (line, msg), "{bad}");
        }
    }

    #[test]
    fn a_comment_without_every_key_is_no_head() {
        let p = Pairs::parse("# sluice pairs v1\n# n_layer=2 made by hand\n0 1 1 3\n").unwrap();
        assert_eq!(p.head, None);
        assert_eq!(p.entries.len(), 1);
    }
}
