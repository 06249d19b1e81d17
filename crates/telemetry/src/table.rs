//! The CSV layout the `io_trace` and `compute_trace` formats share: a `# <kind> v<version>`
//! first line, `#` lines, a column line, data rows. Columns are found by their names in the
//! column line (added columns do not break a reader), `#` lines are skipped, and a malformed
//! file is an error naming the file and line.

use std::str::FromStr;

use crate::Phase;

/// A malformed telemetry file: which file, which line (when one is to blame), what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {msg}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ReadError {
    pub file: String,
    pub line: Option<usize>,
    pub msg: String,
}

impl ReadError {
    /// An error on line `line` (1-based) of `file`.
    pub fn at(file: &str, line: usize, msg: String) -> ReadError {
        ReadError {
            file: file.to_owned(),
            line: Some(line),
            msg,
        }
    }

    /// An error of the whole file `file`.
    pub fn whole(file: &str, msg: String) -> ReadError {
        ReadError {
            file: file.to_owned(),
            line: None,
            msg,
        }
    }
}

type Result<T> = std::result::Result<T, ReadError>;

/// A trace file's `#` lines before its column line, its column line and its data rows, each
/// with its 1-based line number.
pub struct Table<'a> {
    pub file: &'a str,
    /// The `#` lines between the first line and the column line (without the `#`).
    pub preamble: Vec<(usize, &'a str)>,
    pub header_line: usize,
    pub columns: Vec<&'a str>,
    pub rows: Vec<(usize, Vec<&'a str>)>,
}

/// A column of a [`Table`], found by name.
#[derive(Clone, Copy)]
pub struct Col<'n> {
    pub idx: usize,
    pub name: &'n str,
}

/// Splits `text` (the file `file`) into its column line and rows. The first line must be
/// `# <kind> <version>`; other `#` lines and blank lines are skipped wherever they are (those
/// before the column line are kept as the preamble), as is a repeated column line.
pub fn parse_table<'a>(
    file: &'a str,
    text: &'a str,
    kind: &str,
    version: &str,
) -> Result<Table<'a>> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')));
    let want = format!("# {kind} {version}");
    match lines.next() {
        Some((_, l)) if l.trim_end() == want => {}
        Some((_, l)) if l.starts_with(&format!("# {kind} ")) => {
            return Err(ReadError::at(
                file,
                1,
                format!("`{l}`: only {kind} {version} is understood"),
            ));
        }
        Some((_, l)) => {
            return Err(ReadError::at(
                file,
                1,
                format!("expected `{want}`, found `{l}`"),
            ));
        }
        None => {
            return Err(ReadError::whole(
                file,
                format!("empty file, expected `{want}`"),
            ));
        }
    }
    let mut preamble = Vec::new();
    let mut header: Option<(usize, &str)> = None;
    let mut columns: Vec<&str> = Vec::new();
    let mut rows = Vec::new();
    for (n, l) in lines {
        if let Some(comment) = l.strip_prefix('#') {
            if header.is_none() {
                preamble.push((n, comment));
            }
            continue;
        }
        if l.trim().is_empty() {
            continue;
        }
        match header {
            None => {
                header = Some((n, l));
                columns = l.split(',').map(str::trim).collect();
            }
            Some((_, h)) if l == h => {}
            Some(_) => {
                let fields: Vec<&str> = l.split(',').map(str::trim).collect();
                if fields.len() != columns.len() {
                    return Err(ReadError::at(
                        file,
                        n,
                        format!(
                            "{} fields, but the column line has {}",
                            fields.len(),
                            columns.len()
                        ),
                    ));
                }
                rows.push((n, fields));
            }
        }
    }
    let Some((header_line, _)) = header else {
        return Err(ReadError::whole(
            file,
            "no column line after the `#` lines".into(),
        ));
    };
    Ok(Table {
        file,
        preamble,
        header_line,
        columns,
        rows,
    })
}

impl Table<'_> {
    /// The column named `name`.
    pub fn col<'n>(&self, name: &'n str) -> Result<Col<'n>> {
        let idx = self
            .columns
            .iter()
            .position(|c| *c == name)
            .ok_or_else(|| {
                ReadError::at(
                    self.file,
                    self.header_line,
                    format!("the column line has no `{name}` column"),
                )
            })?;
        Ok(Col { idx, name })
    }

    /// A row's field in column `col`, parsed.
    pub fn get<T: FromStr>(&self, row: &(usize, Vec<&str>), col: Col<'_>) -> Result<T> {
        let v = row.1[col.idx];
        v.parse().map_err(|_| {
            ReadError::at(
                self.file,
                row.0,
                format!("column `{}`: `{v}` is not a valid value", col.name),
            )
        })
    }

    /// A row's `phase` field: 0 (prefill) or 1 (decode).
    pub fn phase(&self, row: &(usize, Vec<&str>), col: Col<'_>) -> Result<Phase> {
        let p: u8 = self.get(row, col)?;
        Phase::from_code(p).ok_or_else(|| {
            ReadError::at(
                self.file,
                row.0,
                format!("phase {p}: expected 0 (prefill) or 1 (decode)"),
            )
        })
    }

    /// A row's 0/1 field in column `col`.
    pub fn flag(&self, row: &(usize, Vec<&str>), col: Col<'_>) -> Result<bool> {
        let s: u8 = self.get(row, col)?;
        if s > 1 {
            return Err(ReadError::at(
                self.file,
                row.0,
                format!("{} {s}: expected 0 or 1", col.name),
            ));
        }
        Ok(s == 1)
    }
}
