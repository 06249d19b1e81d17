//! The `route_trace v1` format: a row per routed expert, written by `sluice run --route-trace`
//! (through [`Head::write`] and [`RouteRecord::write`]) and read back by [`RouteTrace::parse`].
//!
//! ```text
//! # route_trace v1
//! # model=<path> arch=<string> n_layer=<int> n_expert=<int> n_expert_used=<int>
//! # layer=<int> expert_bytes=<int> dense_bytes=<int>        (one per MoE layer)
//! turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped
//! 0,0,0,0,0,49,0.221297,0,3059712,0
//! ...
//! ```
//!
//! Columns are read by name: `turn`, `phase`, `step`, `layer`, `slot` and `expert` are
//! required; `weight`, `residency`, `expert_bytes` and `dropped` are optional (older writers
//! lack `dropped`), and columns this reader does not know are skipped, since writers only ever
//! append columns within `v1`. Preamble keys this reader does not know are skipped too, and so
//! are `#` lines it does not recognise. Blank lines are ignored.
//!
//! The writer writes every column, the weight with 6 decimals; a trace it writes parses back
//! into the records it was given (weights as their 6-decimal text reads).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use crate::{Phase, TraceError};

/// The first line of every trace.
pub const MAGIC: &str = "# route_trace v1";

/// The column line the writer writes.
pub const COLUMNS: &str = "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped";

/// Static facts about one MoE layer, from its `# layer=` preamble line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerInfo {
    /// Bytes of one routed expert of this layer: what a cache miss reads from flash.
    pub expert_bytes: u64,
    /// Bytes of the layer's dense (always resident) weights.
    pub dense_bytes: u64,
}

/// One routed expert: one data row of the trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouteRow {
    /// 1-based line number in the file.
    pub line: usize,
    /// Session turn (0 for a one-shot run).
    pub turn: u32,
    pub phase: Phase,
    /// Absolute context position of the routed token (may be negative: unattributed).
    pub step: i64,
    pub layer: u32,
    /// The router's rank of this expert, 0 = top choice.
    pub slot: u32,
    /// The routed expert id.
    pub expert: u32,
    /// The applied routing weight; `None` when the column is absent or holds `nan` (unknown).
    pub weight: Option<f32>,
    /// What the recording engine's cache did: 0 = miss, 1 = hit, 2 = hit on a prefetch.
    pub residency: Option<u8>,
    /// Flash bytes this routing read in the recording run (0 unless it was a miss).
    pub expert_bytes: Option<u64>,
    /// Whether the recording run dropped this routing (never read it).
    pub dropped: Option<bool>,
}

/// A parsed routing trace.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteTrace {
    /// Model path as recorded (may contain spaces).
    pub model: String,
    pub arch: String,
    pub n_layer: u32,
    pub n_expert: u32,
    pub n_expert_used: u32,
    /// Per-layer facts, keyed by layer index.
    pub layers: BTreeMap<u32, LayerInfo>,
    /// The data rows in file order.
    pub rows: Vec<RouteRow>,
}

/// What a trace's preamble states: the model and the bytes of each MoE layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Head {
    /// Model path as recorded (may contain spaces).
    pub model: String,
    pub arch: String,
    pub n_layer: u32,
    pub n_expert: u32,
    pub n_expert_used: u32,
    /// Per-layer facts, keyed by layer index (one `# layer=` line each, in layer order).
    pub layers: BTreeMap<u32, LayerInfo>,
}

impl Head {
    /// Appends the first line, the preamble and the column line to `out`.
    pub fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "{MAGIC}\n# model={} arch={} n_layer={} n_expert={} n_expert_used={}",
            self.model, self.arch, self.n_layer, self.n_expert, self.n_expert_used
        );
        for (l, b) in &self.layers {
            let _ = writeln!(
                out,
                "# layer={l} expert_bytes={} dense_bytes={}",
                b.expert_bytes, b.dense_bytes
            );
        }
        out.push_str(COLUMNS);
        out.push('\n');
    }
}

/// One routed expert as the writer writes it: every column known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouteRecord {
    /// Session turn (0 for a one-shot run).
    pub turn: u32,
    pub phase: Phase,
    /// Absolute context position of the routed token.
    pub step: i64,
    pub layer: u32,
    /// The router's rank of this expert, 0 = top choice.
    pub slot: u32,
    /// The routed expert id.
    pub expert: u32,
    /// The applied routing weight (written with 6 decimals; NaN for unknown).
    pub weight: f32,
    /// What the cache did: 0 = miss, 1 = hit, 2 = hit on a prefetch.
    pub residency: u8,
    /// Flash bytes this routing read (0 unless it was a miss).
    pub expert_bytes: u64,
    /// Whether the run dropped this routing (never read it).
    pub dropped: bool,
}

impl RouteRecord {
    /// Appends the record's data row (with its newline) to `out`.
    pub fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{:.6},{},{},{}",
            self.turn,
            self.phase.code(),
            self.step,
            self.layer,
            self.slot,
            self.expert,
            self.weight,
            self.residency,
            self.expert_bytes,
            u8::from(self.dropped)
        );
    }
}

impl RouteRow {
    /// The row as a [`RouteRecord`], when the file had every column (an unknown weight is NaN).
    pub fn record(&self) -> Option<RouteRecord> {
        Some(RouteRecord {
            turn: self.turn,
            phase: self.phase,
            step: self.step,
            layer: self.layer,
            slot: self.slot,
            expert: self.expert,
            weight: self.weight.unwrap_or(f32::NAN),
            residency: self.residency?,
            expert_bytes: self.expert_bytes?,
            dropped: self.dropped?,
        })
    }
}

/// Reads and parses a trace file; errors name the file.
pub fn read_route_trace(path: &Path) -> Result<RouteTrace, TraceError> {
    let bytes = std::fs::read(path).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let name = path.display().to_string();
    let text = String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..offset]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        TraceError::Malformed {
            source_name: name.clone(),
            line,
            message: "expected UTF-8 text".to_string(),
        }
    })?;
    RouteTrace::parse(&text, &name)
}

/// The column positions of one trace's header line.
struct Columns {
    count: usize,
    turn: usize,
    phase: usize,
    step: usize,
    layer: usize,
    slot: usize,
    expert: usize,
    weight: Option<usize>,
    residency: Option<usize>,
    expert_bytes: Option<usize>,
    dropped: Option<usize>,
}

struct ModelLine {
    model: String,
    arch: String,
    n_layer: u32,
    n_expert: u32,
    n_expert_used: u32,
}

/// Builds the error for line `line` of `name`.
struct At<'a> {
    name: &'a str,
    line: usize,
}

impl At<'_> {
    fn err(&self, message: impl Into<String>) -> TraceError {
        TraceError::Malformed {
            source_name: self.name.to_string(),
            line: self.line,
            message: message.into(),
        }
    }

    fn int<T: std::str::FromStr>(&self, what: &str, text: &str) -> Result<T, TraceError> {
        text.parse::<T>().map_err(|_| {
            self.err(format!(
                "`{what}`: expected a non-negative integer, found `{}`",
                truncate(text)
            ))
        })
    }
}

/// Quotes at most 40 characters of untrusted text in an error message.
fn truncate(text: &str) -> String {
    let mut out: String = text.chars().take(40).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// Splits `key=value key=value` into pairs. A token without `=` continues the previous value
/// (after one space), so that a model path containing spaces survives.
pub fn key_values(text: &str) -> Vec<(&str, String)> {
    let mut out: Vec<(&str, String)> = Vec::new();
    for token in text.split_whitespace() {
        match token.split_once('=') {
            Some((key, value)) if !key.is_empty() => out.push((key, value.to_string())),
            _ => {
                if let Some((_, value)) = out.last_mut() {
                    value.push(' ');
                    value.push_str(token);
                }
            }
        }
    }
    out
}

fn required<'v>(
    at: &At,
    pairs: &'v [(&str, String)],
    key: &str,
    line_kind: &str,
) -> Result<&'v str, TraceError> {
    pairs
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.as_str())
        .ok_or_else(|| at.err(format!("`{line_kind}` line: expected a `{key}=` field")))
}

fn parse_model_line(at: &At, rest: &str) -> Result<ModelLine, TraceError> {
    let pairs = key_values(rest);
    let kind = "# model=";
    let model = required(at, &pairs, "model", kind)?.to_string();
    let arch = required(at, &pairs, "arch", kind)?.to_string();
    let n_layer: u32 = at.int("n_layer", required(at, &pairs, "n_layer", kind)?)?;
    let n_expert: u32 = at.int("n_expert", required(at, &pairs, "n_expert", kind)?)?;
    let n_expert_used: u32 = at.int(
        "n_expert_used",
        required(at, &pairs, "n_expert_used", kind)?,
    )?;
    if n_layer == 0 || n_expert == 0 || n_expert_used == 0 {
        return Err(at.err("`n_layer`, `n_expert` and `n_expert_used` must be positive"));
    }
    if n_expert_used > n_expert {
        return Err(at.err(format!(
            "`n_expert_used` ({n_expert_used}) exceeds `n_expert` ({n_expert})"
        )));
    }
    Ok(ModelLine {
        model,
        arch,
        n_layer,
        n_expert,
        n_expert_used,
    })
}

fn parse_header(at: &At, line: &str) -> Result<Columns, TraceError> {
    let names: Vec<&str> = line.split(',').map(str::trim).collect();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, name) in names.iter().enumerate() {
        if index.insert(name, i).is_some() {
            return Err(at.err(format!("column header: `{}` appears twice", truncate(name))));
        }
    }
    let need = |name: &str| {
        index.get(name).copied().ok_or_else(|| {
            at.err(format!(
                "column header: expected a `{name}` column (need turn,phase,step,layer,slot,expert)"
            ))
        })
    };
    Ok(Columns {
        count: names.len(),
        turn: need("turn")?,
        phase: need("phase")?,
        step: need("step")?,
        layer: need("layer")?,
        slot: need("slot")?,
        expert: need("expert")?,
        weight: index.get("weight").copied(),
        residency: index.get("residency").copied(),
        expert_bytes: index.get("expert_bytes").copied(),
        dropped: index.get("dropped").copied(),
    })
}

impl RouteTrace {
    /// Parses trace text; `name` is used in error messages (normally the file name).
    pub fn parse(text: &str, name: &str) -> Result<RouteTrace, TraceError> {
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim_end()));
        let first = lines.next();
        let first_text = first.map(|(_, l)| l).unwrap_or("");
        if first_text != MAGIC {
            return Err(At { name, line: 1 }.err(format!(
                "expected `{MAGIC}` as the first line, found `{}`",
                truncate(first_text)
            )));
        }

        let mut model: Option<ModelLine> = None;
        let mut layers: BTreeMap<u32, LayerInfo> = BTreeMap::new();
        let mut columns: Option<Columns> = None;
        let mut rows: Vec<RouteRow> = Vec::new();
        // (turn, phase, step, layer, slot) -> line of its first row
        let mut seen: HashMap<(u32, Phase, i64, u32, u32), usize> = HashMap::new();

        for (line_no, line) in lines {
            let at = At {
                name,
                line: line_no,
            };
            if line.trim().is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                if columns.is_some() {
                    continue; // comments after the header carry nothing we read
                }
                let comment = comment.trim_start();
                if comment.starts_with("model=") {
                    if model.is_some() {
                        return Err(at.err("a second `# model=` line"));
                    }
                    model = Some(parse_model_line(&at, comment)?);
                } else if comment.starts_with("layer=") {
                    let Some(m) = &model else {
                        return Err(at.err("`# layer=` line before the `# model=` line"));
                    };
                    let pairs = key_values(comment);
                    let kind = "# layer=";
                    let layer: u32 = at.int("layer", required(&at, &pairs, "layer", kind)?)?;
                    let expert_bytes: u64 =
                        at.int("expert_bytes", required(&at, &pairs, "expert_bytes", kind)?)?;
                    let dense_bytes: u64 =
                        at.int("dense_bytes", required(&at, &pairs, "dense_bytes", kind)?)?;
                    if layer >= m.n_layer {
                        return Err(at.err(format!(
                            "`layer={layer}`: expected a layer below n_layer={}",
                            m.n_layer
                        )));
                    }
                    let info = LayerInfo {
                        expert_bytes,
                        dense_bytes,
                    };
                    if layers.insert(layer, info).is_some() {
                        return Err(at.err(format!("a second `# layer={layer}` line")));
                    }
                }
                continue;
            }
            let Some(cols) = &columns else {
                if model.is_none() {
                    return Err(
                        at.err("expected the `# model=` preamble line before the column header")
                    );
                }
                columns = Some(parse_header(&at, line)?);
                continue;
            };
            // `columns` set implies `model` set (checked above).
            let Some(m) = &model else {
                return Err(at.err("expected the `# model=` preamble line"));
            };
            let row = parse_row(&at, line, cols, m, &layers)?;
            if let Some(first) = seen.insert(
                (row.turn, row.phase, row.step, row.layer, row.slot),
                line_no,
            ) {
                return Err(at.err(format!(
                    "duplicate row: turn={} phase={} step={} layer={} slot={} already on line {first}",
                    row.turn,
                    row.phase.code(),
                    row.step,
                    row.layer,
                    row.slot
                )));
            }
            rows.push(row);
        }

        let Some(m) = model else {
            return Err(At {
                name,
                line: text.lines().count().max(1),
            }
            .err("end of file: expected a `# model=` preamble line"));
        };
        if columns.is_none() {
            return Err(At {
                name,
                line: text.lines().count().max(1),
            }
            .err("end of file: expected the column header line (turn,phase,step,layer,slot,expert,...)"));
        }
        Ok(RouteTrace {
            model: m.model,
            arch: m.arch,
            n_layer: m.n_layer,
            n_expert: m.n_expert,
            n_expert_used: m.n_expert_used,
            layers,
            rows,
        })
    }

    /// The trace's preamble.
    pub fn head(&self) -> Head {
        Head {
            model: self.model.clone(),
            arch: self.arch.clone(),
            n_layer: self.n_layer,
            n_expert: self.n_expert,
            n_expert_used: self.n_expert_used,
            layers: self.layers.clone(),
        }
    }

    /// Bytes one expert of `layer` occupies in the cache (0 for a layer the preamble omits,
    /// which the parser never lets a row name).
    pub fn expert_bytes(&self, layer: u32) -> u64 {
        self.layers.get(&layer).map_or(0, |l| l.expert_bytes)
    }

    /// Decoded tokens: distinct `(turn, step)` pairs in the decode phase.
    pub fn decode_tokens(&self) -> usize {
        let mut tokens: Vec<(u32, i64)> = self
            .rows
            .iter()
            .filter(|r| r.phase == Phase::Decode)
            .map(|r| (r.turn, r.step))
            .collect();
        tokens.sort_unstable();
        tokens.dedup();
        tokens.len()
    }

    /// The decode steps in file order (a step is a distinct `(turn, step)`), each with its
    /// routed experts per layer in slot order: what a replay makes a model route.
    pub fn decode_steps(&self) -> Vec<BTreeMap<u32, Vec<u32>>> {
        self.steps(|p| p == Phase::Decode, false)
    }

    /// The steps of the phases `accept` takes, in file order (a step is a distinct
    /// `(turn, phase, step)`), each with its routed experts per layer in slot order (with
    /// `dedup`, an expert repeated within a cell counted once; without, as recorded, so that a
    /// replay can refuse it).
    pub fn steps(
        &self,
        accept: impl Fn(Phase) -> bool,
        dedup: bool,
    ) -> Vec<BTreeMap<u32, Vec<u32>>> {
        /// Per layer: (slot, expert) pairs.
        type Cells = BTreeMap<u32, Vec<(u32, u32)>>;
        let mut order: Vec<(u32, Phase, i64)> = Vec::new();
        let mut cells: std::collections::HashMap<(u32, Phase, i64), Cells> =
            std::collections::HashMap::new();
        for r in self.rows.iter().filter(|r| accept(r.phase)) {
            let key = (r.turn, r.phase, r.step);
            let step = cells.entry(key).or_insert_with(|| {
                order.push(key);
                BTreeMap::new()
            });
            step.entry(r.layer).or_default().push((r.slot, r.expert));
        }
        order
            .iter()
            .filter_map(|key| cells.remove(key))
            .map(|layers| {
                layers
                    .into_iter()
                    .map(|(layer, mut cell)| {
                        cell.sort_unstable();
                        let mut experts: Vec<u32> = Vec::with_capacity(cell.len());
                        for (_, e) in cell {
                            if !dedup || !experts.contains(&e) {
                                experts.push(e);
                            }
                        }
                        (layer, experts)
                    })
                    .collect()
            })
            .collect()
    }

    /// One token cycle: the bytes every layer's top-k would read if nothing were cached
    /// (`Σ_layers n_expert_used × expert_bytes(layer)`). A global LRU cache smaller than this
    /// cannot keep anything from one token to the next.
    pub fn token_cycle_bytes(&self) -> u64 {
        self.layers
            .values()
            .map(|l| l.expert_bytes.saturating_mul(u64::from(self.n_expert_used)))
            .fold(0u64, u64::saturating_add)
    }
}

fn parse_row(
    at: &At,
    line: &str,
    cols: &Columns,
    m: &ModelLine,
    layers: &BTreeMap<u32, LayerInfo>,
) -> Result<RouteRow, TraceError> {
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    if fields.len() != cols.count {
        return Err(at.err(format!(
            "expected {} comma-separated fields (one per header column), found {}",
            cols.count,
            fields.len()
        )));
    }
    let turn: u32 = at.int("turn", fields[cols.turn])?;
    let phase = match fields[cols.phase] {
        "0" => Phase::Prefill,
        "1" => Phase::Decode,
        other => {
            return Err(at.err(format!(
                "`phase`: expected 0 (prefill) or 1 (decode), found `{}`",
                truncate(other)
            )));
        }
    };
    let step_text = fields[cols.step];
    let step: i64 = step_text.parse().map_err(|_| {
        at.err(format!(
            "`step`: expected an integer, found `{}`",
            truncate(step_text)
        ))
    })?;
    let layer: u32 = at.int("layer", fields[cols.layer])?;
    if !layers.contains_key(&layer) {
        return Err(at.err(format!(
            "`layer`: {layer} has no `# layer={layer} expert_bytes=... dense_bytes=...` preamble line"
        )));
    }
    let slot: u32 = at.int("slot", fields[cols.slot])?;
    if slot >= m.n_expert_used {
        return Err(at.err(format!(
            "`slot`: expected 0..{} (n_expert_used={}), found {slot}",
            m.n_expert_used - 1,
            m.n_expert_used
        )));
    }
    let expert: u32 = at.int("expert", fields[cols.expert])?;
    if expert >= m.n_expert {
        return Err(at.err(format!(
            "`expert`: expected 0..{} (n_expert={}), found {expert}",
            m.n_expert - 1,
            m.n_expert
        )));
    }
    let weight = match cols.weight {
        None => None,
        Some(i) => {
            let text = fields[i];
            let w: f32 = text.parse().map_err(|_| {
                at.err(format!(
                    "`weight`: expected a number or `nan`, found `{}`",
                    truncate(text)
                ))
            })?;
            if w.is_nan() { None } else { Some(w) }
        }
    };
    let residency = match cols.residency {
        None => None,
        Some(i) => match fields[i] {
            "0" => Some(0),
            "1" => Some(1),
            "2" => Some(2),
            other => {
                return Err(at.err(format!(
                    "`residency`: expected 0, 1 or 2, found `{}`",
                    truncate(other)
                )));
            }
        },
    };
    let expert_bytes = match cols.expert_bytes {
        None => None,
        Some(i) => Some(at.int::<u64>("expert_bytes", fields[i])?),
    };
    let dropped = match cols.dropped {
        None => None,
        Some(i) => match fields[i] {
            "0" => Some(false),
            "1" => Some(true),
            other => {
                return Err(at.err(format!(
                    "`dropped`: expected 0 or 1, found `{}`",
                    truncate(other)
                )));
            }
        },
    };
    Ok(RouteRow {
        line: at.line,
        turn,
        phase,
        step,
        layer,
        slot,
        expert,
        weight,
        residency,
        expert_bytes,
        dropped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    fn head() -> impl Strategy<Value = Head> {
        (1u32..40, 1u32..300).prop_flat_map(|(n_layer, n_expert)| {
            (
                "[a-zA-Z0-9/._-]{1,12}( [a-zA-Z0-9/._-]{1,8}){0,2}",
                "[a-z0-9]{1,8}",
                1..=n_expert,
                proptest::collection::btree_map(0..n_layer, (any::<u64>(), any::<u64>()), 1..6),
            )
                .prop_map(move |(model, arch, n_expert_used, layers)| Head {
                    model,
                    arch,
                    n_layer,
                    n_expert,
                    n_expert_used,
                    layers: layers
                        .into_iter()
                        .map(|(l, (expert_bytes, dense_bytes))| {
                            (
                                l,
                                LayerInfo {
                                    expert_bytes,
                                    dense_bytes,
                                },
                            )
                        })
                        .collect(),
                })
        })
    }

    /// A preamble and rows that follow it, no two rows in one (turn, phase, step, layer, slot)
    /// cell, weights that 6 decimals hold exactly.
    fn trace() -> impl Strategy<Value = (Head, Vec<RouteRecord>)> {
        head()
            .prop_flat_map(|h| {
                let layers: Vec<u32> = h.layers.keys().copied().collect();
                let record = (
                    (any::<u32>(), any::<bool>(), any::<i64>()),
                    proptest::sample::select(layers),
                    0..h.n_expert_used,
                    0..h.n_expert,
                    0u32..=1_000_000,
                    0u8..3,
                    any::<u64>(),
                    any::<bool>(),
                )
                    .prop_map(
                        |(
                            (turn, decode, step),
                            layer,
                            slot,
                            expert,
                            w,
                            residency,
                            bytes,
                            dropped,
                        )| {
                            RouteRecord {
                                turn,
                                phase: if decode {
                                    Phase::Decode
                                } else {
                                    Phase::Prefill
                                },
                                step,
                                layer,
                                slot,
                                expert,
                                weight: w as f32 / 1e6,
                                residency,
                                expert_bytes: bytes,
                                dropped,
                            }
                        },
                    );
                (Just(h), proptest::collection::vec(record, 0..40))
            })
            .prop_map(|(h, mut rows)| {
                let mut seen = HashSet::new();
                rows.retain(|r| seen.insert((r.turn, r.phase, r.step, r.layer, r.slot)));
                (h, rows)
            })
    }

    fn write(h: &Head, rows: &[RouteRecord]) -> String {
        let mut text = String::new();
        h.write(&mut text);
        for r in rows {
            r.write(&mut text);
        }
        text
    }

    proptest! {
        #[test]
        fn written_records_parse_back_equal((h, rows) in trace()) {
            let text = write(&h, &rows);
            let t = RouteTrace::parse(&text, "t.csv").expect("the writer's text parses");
            prop_assert_eq!(t.head(), h);
            let back: Vec<Option<RouteRecord>> = t.rows.iter().map(RouteRow::record).collect();
            let want: Vec<Option<RouteRecord>> = rows.into_iter().map(Some).collect();
            prop_assert_eq!(back, want);
        }

        #[test]
        fn parsed_text_writes_back_identical((h, rows) in trace()) {
            let text = write(&h, &rows);
            let t = RouteTrace::parse(&text, "t.csv").expect("parses");
            let records: Vec<RouteRecord> = t.rows.iter().filter_map(RouteRow::record).collect();
            prop_assert_eq!(write(&t.head(), &records), text);
        }
    }

    #[test]
    fn an_unknown_weight_is_written_as_nan_and_read_as_none() {
        let h = Head {
            model: "m".into(),
            arch: "a".into(),
            n_layer: 1,
            n_expert: 2,
            n_expert_used: 1,
            layers: BTreeMap::from([(
                0,
                LayerInfo {
                    expert_bytes: 1,
                    dense_bytes: 2,
                },
            )]),
        };
        let r = RouteRecord {
            turn: 0,
            phase: Phase::Decode,
            step: 3,
            layer: 0,
            slot: 0,
            expert: 1,
            weight: f32::NAN,
            residency: 1,
            expert_bytes: 0,
            dropped: false,
        };
        let text = write(&h, &[r]);
        assert!(text.ends_with("\n0,1,3,0,0,1,NaN,1,0,0\n"), "{text}");
        let t = RouteTrace::parse(&text, "t.csv").expect("parses");
        assert_eq!(t.rows[0].weight, None);
        assert!(t.rows[0].record().is_some_and(|r| r.weight.is_nan()));
    }
}
