//! The expert-use history: how often each routed expert was selected, kept across runs in a
//! `.coli_usage` file that colibri's engines read and write too.
//!
//! The file is text, one record per line, exactly three integers separated by single spaces,
//! sparse (only non-zero counts):
//!
//! ```text
//! -1 <n_layers> <n_experts>
//! -2 <format_version> <engine_id>
//! <layer> <expert> <count>
//! ...
//! ```
//!
//! Every reader written against the original headerless format is the loop "scan `%d %d %u`
//! while three fields parse, drop records with a negative layer", so the two header records
//! have a negative first field (old readers skip them), only numbers (a non-number ends an old
//! reader's loop) and exactly three fields (a fourth would desynchronise it and fabricate a
//! record). The engine id is the 32-bit FNV-1a hash of the writing engine's name, printed
//! unsigned in the third field, the one old readers parse as unsigned. Counts are unsigned
//! 32-bit in the file (saturated). A history with no counts is saved as a zero-byte file, so
//! a size test tells "no history" apart.
//!
//! [`read_into`] emulates that old loop byte for byte (including its number parsing), checks
//! the header records, and refuses a history of another shape, a newer format, or (unless the
//! user named the path, a *trusted* read) another engine; refusals and notices are returned as
//! the exact lines the caller prints. A headerless (legacy) file is accepted unvalidated.
//! Inkling's dense binary layout (`IKU1`) is recognised: refused by name on an untrusted read,
//! read on a trusted one when its dimensions match.
//!
//! [`save`] applies the decay factor, then writes `<path>.tmp` and renames it over `<path>`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The format version written in the `-2` record; a file declaring a newer one is refused.
pub const FORMAT_VERSION: u32 = 1;

/// Engine names whose ids are recognised when naming the writer of a foreign history.
pub const KNOWN_ENGINES: [&str; 4] = ["glm_moe_dsa", "inkling", "olmoe", "kimi_k3"];

/// The first four bytes of inkling's dense binary history, read as a little-endian `u32`
/// (the ASCII bytes `IKU1`).
pub const IKU1_MAGIC: u32 = 0x3155_4B49;

/// The engine that writes the `IKU1` layout.
const IKU1_WRITER: &str = "inkling";

/// colibri builds `<path>.tmp` in a buffer of this many bytes (terminator included); a path
/// whose temporary name does not fit is not saved.
const PATH_BUFFER: usize = 2100;

/// The trusted-read notice is given once per process.
static NOTICE_GIVEN: AtomicBool = AtomicBool::new(false);

/// The engine id of an engine name: FNV-1a, 32 bits, over the name's bytes (the offset basis
/// for an empty name).
pub fn engine_id(name: &str) -> u32 {
    name.bytes().fold(0x811C_9DC5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The engine name written into a history for a model architecture: `olmoe` for `olmoe`
/// (colibri's OLMoE engine, so the two share histories), `sluice_<arch>` otherwise.
pub fn engine_name(arch: &str) -> String {
    if arch == "olmoe" {
        "olmoe".to_string()
    } else {
        format!("sluice_{arch}")
    }
}

/// The decay factor from the value of `COLI_USAGE_DECAY`: parsed like C's `atof` (the longest
/// numeric prefix; no number gives 0), unset → 1.0, and anything not in `(0, 1]` (NaN
/// included) → 1.0.
pub fn decay_from_env(value: Option<&str>) -> f64 {
    let Some(value) = value else { return 1.0 };
    let d = atof(value);
    if d.is_nan() || d <= 0.0 || d > 1.0 {
        1.0
    } else {
        d
    }
}

/// C's `isspace` in the C locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// C's `atof`: leading white space, then the longest prefix that is a decimal or hexadecimal
/// floating constant, `inf`/`infinity` or `nan` (case-insensitive), optionally signed; 0 when
/// there is none.
fn atof(s: &str) -> f64 {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && is_c_space(b[i]) {
        i += 1;
    }
    let mut negative = false;
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        negative = b[i] == b'-';
        i += 1;
    }
    let magnitude = unsigned_float_prefix(&b[i..]).unwrap_or(0.0);
    if negative { -magnitude } else { magnitude }
}

/// The value of the longest unsigned floating constant at the start of `b`, if any.
fn unsigned_float_prefix(b: &[u8]) -> Option<f64> {
    let lower = |n: usize| -> Vec<u8> { b.iter().take(n).map(u8::to_ascii_lowercase).collect() };
    if lower(8) == b"infinity" || lower(3) == b"inf" {
        return Some(f64::INFINITY);
    }
    if lower(3) == b"nan" {
        return Some(f64::NAN);
    }
    if lower(2) == b"0x" {
        if let Some(v) = hex_float_prefix(&b[2..]) {
            return Some(v);
        }
        // "0x" not followed by a hexadecimal digit: the constant is the "0".
        return Some(0.0);
    }
    let digits = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let int_digits = digits(0);
    let mut end = int_digits;
    let mut frac_digits = 0;
    if end < b.len() && b[end] == b'.' {
        frac_digits = digits(end + 1);
        end += 1 + frac_digits;
    }
    if int_digits + frac_digits == 0 {
        return None;
    }
    if end < b.len() && (b[end] == b'e' || b[end] == b'E') {
        let mut j = end + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        let exp_digits = digits(j);
        if exp_digits > 0 {
            end = j + exp_digits;
        }
    }
    std::str::from_utf8(&b[..end]).ok()?.parse::<f64>().ok()
}

/// The value of a hexadecimal floating constant after its `0x`, if one starts there.
fn hex_float_prefix(b: &[u8]) -> Option<f64> {
    let mut i = 0;
    let mut mantissa = 0.0_f64;
    let mut any = false;
    let mut scale: i64 = 0;
    while i < b.len() && b[i].is_ascii_hexdigit() {
        mantissa = mantissa * 16.0 + f64::from((b[i] as char).to_digit(16)?);
        any = true;
        i += 1;
    }
    if i < b.len() && b[i] == b'.' {
        i += 1;
        while i < b.len() && b[i].is_ascii_hexdigit() {
            mantissa = mantissa * 16.0 + f64::from((b[i] as char).to_digit(16)?);
            scale -= 4;
            any = true;
            i += 1;
        }
    }
    if !any {
        return None;
    }
    if i < b.len() && (b[i] == b'p' || b[i] == b'P') {
        let mut j = i + 1;
        let mut negative = false;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            negative = b[j] == b'-';
            j += 1;
        }
        let start = j;
        let mut exp: i64 = 0;
        while j < b.len() && b[j].is_ascii_digit() {
            exp = (exp * 10 + i64::from(b[j] - b'0')).min(100_000);
            j += 1;
        }
        if j > start {
            scale += if negative { -exp } else { exp };
        }
    }
    let scale = i32::try_from(scale.clamp(-100_000, 100_000)).unwrap_or(0);
    Some(mantissa * 2f64.powi(scale))
}

/// How often each routed expert was selected, by `(layer, expert)`, for a model of `n_layers`
/// layers of which the MoE layers route among `n_experts` experts.
///
/// Only MoE layers and in-range experts can be credited: a count for anything else is
/// ignored, both when routing adds it and when a history is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    n_layers: u32,
    n_experts: u32,
    moe: BTreeSet<u32>,
    counts: BTreeMap<(u32, u32), u64>,
}

impl Usage {
    /// An empty history; `moe_layers` are the layers that route (entries not below `n_layers`
    /// are ignored).
    pub fn new(n_layers: u32, n_experts: u32, moe_layers: &[u32]) -> Usage {
        Usage {
            n_layers,
            n_experts,
            moe: moe_layers
                .iter()
                .copied()
                .filter(|&l| l < n_layers)
                .collect(),
            counts: BTreeMap::new(),
        }
    }

    /// The number of layers (the `-1` record's second field).
    pub fn n_layers(&self) -> u32 {
        self.n_layers
    }

    /// The number of experts per MoE layer (the `-1` record's third field).
    pub fn n_experts(&self) -> u32 {
        self.n_experts
    }

    /// Whether a count for `(layer, expert)` can be credited: a MoE layer and an expert in range.
    pub fn accepts(&self, layer: u32, expert: u32) -> bool {
        layer < self.n_layers && expert < self.n_experts && self.moe.contains(&layer)
    }

    /// Credits `n` selections to `(layer, expert)` (saturating); `false`, and nothing counted,
    /// outside the MoE layers or the experts.
    pub fn add(&mut self, layer: u32, expert: u32, n: u64) -> bool {
        if !self.accepts(layer, expert) {
            return false;
        }
        if n > 0 {
            let c = self.counts.entry((layer, expert)).or_insert(0);
            *c = c.saturating_add(n);
        }
        true
    }

    /// The selections credited to `(layer, expert)`.
    pub fn count(&self, layer: u32, expert: u32) -> u64 {
        self.counts.get(&(layer, expert)).copied().unwrap_or(0)
    }

    /// All selections credited (saturating).
    pub fn selections(&self) -> u64 {
        self.counts.values().fold(0u64, |s, &c| s.saturating_add(c))
    }

    /// The number of experts with a non-zero count.
    pub fn distinct(&self) -> u64 {
        self.counts.len() as u64
    }

    /// The non-zero counts, by `(layer, expert)` ascending.
    pub fn iter(&self) -> impl Iterator<Item = ((u32, u32), u64)> + '_ {
        self.counts.iter().map(|(&k, &c)| (k, c))
    }

    /// Scales every count by `d`, rounding half up (`c` becomes `⌊c·d + ½⌋`); counts that fall
    /// to 0 are dropped. `d >= 1` (or NaN) changes nothing.
    pub fn decay(&mut self, d: f64) {
        if d.is_nan() || d >= 1.0 {
            return;
        }
        self.counts.retain(|_, c| {
            // Float to integer `as` truncates toward zero (the half-up rounding, as the value
            // is ≥ 0.5 for a non-negative d) and saturates below at 0.
            *c = (*c as f64 * d + 0.5) as u64;
            *c != 0
        });
    }

    /// The file contents for a history written by `engine`: the two header records, then one
    /// record per non-zero count (saturated to `u32::MAX`); empty when there are no counts.
    pub fn to_text(&self, engine: &str) -> String {
        let mut s = String::new();
        if self.counts.is_empty() {
            return s;
        }
        // Writing to a String cannot fail.
        let _ = writeln!(s, "-1 {} {}", self.n_layers, self.n_experts);
        let _ = writeln!(s, "-2 {FORMAT_VERSION} {}", engine_id(engine));
        for (&(l, e), &c) in &self.counts {
            let _ = writeln!(s, "{l} {e} {}", u32::try_from(c).unwrap_or(u32::MAX));
        }
        s
    }

    /// Credits one record read from a file; `false` when it names nothing this model routes.
    fn credit(&mut self, layer: i32, expert: i32, n: u32) -> bool {
        match (u32::try_from(layer), u32::try_from(expert)) {
            (Ok(l), Ok(e)) => self.add(l, e, u64::from(n)),
            _ => false,
        }
    }
}

/// What reading a history gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadOutcome {
    /// No history: the file does not exist or is empty.
    Missing,
    /// The history was added to the counts.
    Loaded {
        /// Records credited (records naming a dense layer or an expert out of range are not).
        accepted: u64,
        /// The lines to print when a trusted read honoured another engine's history (given
        /// once per process; `None` after that and when the engines agree).
        notice: Option<String>,
    },
    /// The history was refused; the message (one line) says why. The counts are unchanged.
    Refused(String),
}

/// A history that could not be read or written; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// The file could not be read, written or renamed.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        error: io::Error,
    },
    /// An `IKU1` history shorter than its header says.
    #[error("{}: truncated IKU1 history: {found} bytes, the layout needs {needed}", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes the file holds.
        found: u64,
        /// Bytes its header (or the header itself) needs.
        needed: u64,
    },
}

/// Reads the history at `path` into `usage`, for the engine named `engine`.
///
/// `trusted` says the user named the path: a history written by another engine is then
/// honoured (with a notice) instead of refused. Format version and dimensions are checked
/// either way. `extra_names` are further engine names (beyond [`KNOWN_ENGINES`]) by which the
/// writer of a foreign history may be named. On [`ReadOutcome::Refused`], `usage` is
/// unchanged.
pub fn read_into(
    path: &Path,
    usage: &mut Usage,
    engine: &str,
    extra_names: &[&str],
    trusted: bool,
) -> Result<ReadOutcome, UsageError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(ReadOutcome::Missing),
        Err(error) => {
            return Err(UsageError::Io {
                path: path.to_path_buf(),
                error,
            });
        }
    };
    if bytes.is_empty() {
        return Ok(ReadOutcome::Missing);
    }
    if bytes.starts_with(&IKU1_MAGIC.to_le_bytes()) {
        return read_iku1(path, &bytes, usage, engine, trusted);
    }

    let own_id = engine_id(engine);
    let mut foreign: Option<u32> = None;
    let mut records = Vec::new();
    let mut scan = Scanner { b: &bytes, pos: 0 };
    while let Some((l, e, c)) = scan.triple() {
        if l >= 0 {
            records.push((l, e, c));
            continue;
        }
        match l {
            -1 if i64::from(e) != i64::from(usage.n_layers) || c != usage.n_experts => {
                return Ok(ReadOutcome::Refused(format!(
                    "[USAGE] {}: history is {e} layers x {c} experts, this engine is {} x {} \u{2014} refusing rather than misreading it",
                    path.display(),
                    usage.n_layers as i32,
                    usage.n_experts as i32,
                )));
            }
            -2 => {
                if i64::from(e) > i64::from(FORMAT_VERSION) {
                    return Ok(ReadOutcome::Refused(format!(
                        "[USAGE] {}: format version {e}, this build reads {FORMAT_VERSION} \u{2014} refusing rather than misreading it",
                        path.display(),
                    )));
                }
                if c != own_id {
                    if !trusted {
                        return Ok(ReadOutcome::Refused(identity_refusal(
                            path,
                            &writer_name(c, extra_names),
                            engine,
                        )));
                    }
                    foreign = Some(c);
                }
            }
            // Reserved for future header records.
            _ => {}
        }
    }

    let mut accepted = 0u64;
    for (l, e, c) in records {
        if usage.credit(l, e, c) {
            accepted += 1;
        }
    }
    let notice = foreign.and_then(|id| notice_once(path, &writer_name(id, extra_names), engine));
    Ok(ReadOutcome::Loaded { accepted, notice })
}

/// Reads inkling's dense binary history: `u32` LE magic, `n_layers`, `n_experts`, then
/// `n_layers × n_experts` `u32` LE counts, layer-major.
fn read_iku1(
    path: &Path,
    bytes: &[u8],
    usage: &mut Usage,
    engine: &str,
    trusted: bool,
) -> Result<ReadOutcome, UsageError> {
    let foreign = engine_id(engine) != engine_id(IKU1_WRITER);
    if foreign && !trusted {
        return Ok(ReadOutcome::Refused(identity_refusal(
            path,
            IKU1_WRITER,
            engine,
        )));
    }
    let word = |i: usize| -> Option<u32> {
        let b = bytes.get(4 * i..4 * i + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let (Some(n_layers), Some(n_experts)) = (word(1), word(2)) else {
        return Err(UsageError::Truncated {
            path: path.to_path_buf(),
            found: bytes.len() as u64,
            needed: 12,
        });
    };
    if n_layers != usage.n_layers || n_experts != usage.n_experts {
        return Ok(ReadOutcome::Refused(format!(
            "[USAGE] {}: history is {n_layers} layers x {n_experts} experts, this engine is {} x {} \u{2014} refusing rather than misreading it",
            path.display(),
            usage.n_layers as i32,
            usage.n_experts as i32,
        )));
    }
    let needed = 12 + 4 * u64::from(n_layers) * u64::from(n_experts);
    if (bytes.len() as u64) < needed {
        return Err(UsageError::Truncated {
            path: path.to_path_buf(),
            found: bytes.len() as u64,
            needed,
        });
    }
    let mut accepted = 0u64;
    for (i, cell) in bytes[12..]
        .chunks_exact(4)
        .take(n_layers as usize * n_experts as usize)
        .enumerate()
    {
        let count = u32::from_le_bytes([cell[0], cell[1], cell[2], cell[3]]);
        if count == 0 {
            continue;
        }
        let layer = (i / n_experts as usize) as u32;
        let expert = (i % n_experts as usize) as u32;
        if usage.add(layer, expert, u64::from(count)) {
            accepted += 1;
        }
    }
    let notice = if foreign {
        notice_once(path, IKU1_WRITER, engine)
    } else {
        None
    };
    Ok(ReadOutcome::Loaded { accepted, notice })
}

/// The refusal of a history written by another engine.
fn identity_refusal(path: &Path, writer: &str, engine: &str) -> String {
    format!(
        "[USAGE] {}: written by {writer}, this engine is {engine} \u{2014} refusing (pass PIN=<path> to use it anyway)",
        path.display()
    )
}

/// The notice of a trusted read honouring another engine's history, the first time only.
fn notice_once(path: &Path, writer: &str, engine: &str) -> Option<String> {
    if NOTICE_GIVEN.swap(true, Ordering::Relaxed) {
        return None;
    }
    Some(format!(
        "[USAGE] {}: written by {writer}, this engine is {engine}\n        \u{2014} honouring it because you named it explicitly\n          (placement only; expert ids do not transfer between engines)",
        path.display()
    ))
}

/// The name of the engine with id `id`, from [`KNOWN_ENGINES`] and `extra`.
fn writer_name(id: u32, extra: &[&str]) -> String {
    KNOWN_ENGINES
        .iter()
        .chain(extra)
        .find(|n| engine_id(n) == id)
        .map_or_else(|| "an unknown engine".to_string(), |n| (*n).to_string())
}

/// The old reader's `fscanf(f, "%d %d %u", ...)`, over bytes, as glibc does it.
struct Scanner<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Scanner<'_> {
    /// The next record, or `None` where fscanf would return fewer than 3.
    fn triple(&mut self) -> Option<(i32, i32, u32)> {
        let l = self.signed()?;
        let e = self.signed()?;
        let c = self.unsigned()?;
        Some((l, e, c))
    }

    /// White space, an optional sign and at least one decimal digit: the sign and the
    /// magnitude (`None` when it exceeds `u64`).
    fn number(&mut self) -> Option<(bool, Option<u64>)> {
        while self.pos < self.b.len() && is_c_space(self.b[self.pos]) {
            self.pos += 1;
        }
        let mut negative = false;
        if let Some(&s @ (b'+' | b'-')) = self.b.get(self.pos) {
            negative = s == b'-';
            self.pos += 1;
        }
        let start = self.pos;
        let mut magnitude = Some(0u64);
        while let Some(&d) = self.b.get(self.pos).filter(|d| d.is_ascii_digit()) {
            magnitude = magnitude
                .and_then(|m| m.checked_mul(10))
                .and_then(|m| m.checked_add(u64::from(d - b'0')));
            self.pos += 1;
        }
        (self.pos > start).then_some((negative, magnitude))
    }

    /// `%d`: the text is converted as a C `long` (saturating), then stored into an `int`
    /// (keeping the low 32 bits).
    fn signed(&mut self) -> Option<i32> {
        let (negative, magnitude) = self.number()?;
        let value: i64 = match magnitude {
            None => {
                if negative {
                    i64::MIN
                } else {
                    i64::MAX
                }
            }
            Some(m) if negative => 0i64.checked_sub_unsigned(m).unwrap_or(i64::MIN),
            Some(m) => i64::try_from(m).unwrap_or(i64::MAX),
        };
        Some(value as i32)
    }

    /// `%u`: the text is converted as a C `unsigned long` (saturating; a minus sign negates
    /// modulo 2^64), then stored into an `unsigned int` (keeping the low 32 bits).
    fn unsigned(&mut self) -> Option<u32> {
        let (negative, magnitude) = self.number()?;
        let value = match magnitude {
            None => u64::MAX,
            Some(m) if negative => m.wrapping_neg(),
            Some(m) => m,
        };
        Some(value as u32)
    }
}

/// Saves `usage` to `path` as written by `engine`, after applying the decay factor `decay`
/// (see [`Usage::decay`]; it is applied even when the path is too long to save).
///
/// Writes `<path>.tmp` and renames it over `path`, so a reader sees the old or the new
/// history, never a partial one. Returns the line to print: the selections and distinct
/// experts saved, or, when `<path>.tmp` would not fit colibri's path buffer, that nothing was
/// saved.
pub fn save(
    path: &Path,
    usage: &mut Usage,
    engine: &str,
    decay: f64,
) -> Result<String, UsageError> {
    usage.decay(decay);
    if path.as_os_str().len() + ".tmp".len() >= PATH_BUFFER {
        return Ok(format!(
            "[STATS] path too long, not saved: {}",
            path.display()
        ));
    }
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    if let Err(error) = std::fs::write(&tmp, usage.to_text(engine)) {
        // Best effort: a partial temporary file is of no use to anyone.
        let _ = std::fs::remove_file(&tmp);
        return Err(UsageError::Io { path: tmp, error });
    }
    // std's rename replaces an existing destination on every platform.
    if let Err(error) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(UsageError::Io {
            path: path.to_path_buf(),
            error,
        });
    }
    Ok(format!(
        "[STATS] {} selections across {} distinct experts -> {}",
        usage.selections(),
        usage.distinct(),
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::Scanner;

    /// The number conversions at their edges (overflow, a minus sign on `%u`, no separator,
    /// a hex prefix). The expected triples were printed by glibc 2.36's `fscanf` running
    /// the old loop over the same bytes:
    ///
    /// ```c
    /// int l, e; unsigned cnt;
    /// while (fscanf(f, "%d %d %u", &l, &e, &cnt) == 3) printf("%d %d %u\n", l, e, cnt);
    /// ```
    #[test]
    fn scanner_matches_glibc_fscanf() {
        let input = b"1 2 -1\n3 4294967296 5\n99999999999999999999999 -3 18446744073709551617\n\
            -2147483649 +7 4294967295\n1 2 -18446744073709551616\n2-3 4\n+5 -0 0x10\n7 8 9";
        let mut s = Scanner { b: input, pos: 0 };
        let got: Vec<_> = std::iter::from_fn(|| s.triple()).collect();
        assert_eq!(
            got,
            vec![
                (1, 2, 4294967295),
                (3, 0, 5),
                (-1, -3, 4294967295),
                (2147483647, 7, 4294967295),
                (1, 2, 4294967295),
                (2, -3, 4),
                (5, 0, 0),
            ]
        );
    }
}
