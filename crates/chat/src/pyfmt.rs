//! Python's text forms of template values: `json.dumps` (the `tojson` filter of Hugging Face's
//! template environment), `repr` (what Jinja2 prints for a list or a dict) and `float.__repr__`.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Options of Python's `json.dumps` that Hugging Face's `tojson` exposes.
#[derive(Debug, Clone, Default)]
pub(crate) struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: newline plus `s` repeated per level (an integer indent `n`
    /// is `n` spaces, a negative one the empty string).
    pub indent: Option<String>,
    /// `(item, key)` separators; the default depends on `indent` as in Python.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

fn type_error(what: &str) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {what} is not JSON serializable"),
    )
}

/// Python's `float.__repr__`: the shortest digits that round-trip, in fixed notation when the
/// decimal exponent lies in [-4, 16) and in scientific notation (`1e+16`, `1.5e-05`) otherwise.
pub(crate) fn float_repr(v: f64) -> String {
    if v.is_nan() {
        return "nan".to_owned();
    }
    if v.is_infinite() {
        return if v < 0.0 { "-inf" } else { "inf" }.to_owned();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0" } else { "0.0" }.to_owned();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{v:e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            for _ in 0..(-exp - 1) {
                out.push('0');
            }
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                for _ in digits.len()..int_len {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exp.abs()));
    }
    out
}

fn number_text(v: &Value, json: bool) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    match f64::try_from(v.clone()) {
        Ok(f) if json && f.is_nan() => "NaN".to_owned(),
        Ok(f) if json && f.is_infinite() => {
            if f < 0.0 { "-Infinity" } else { "Infinity" }.to_owned()
        }
        Ok(f) => float_repr(f),
        Err(_) => v.to_string(),
    }
}

/// Python's JSON string literal (`json.dumps` of a `str`).
pub(crate) fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Entries of a map value in its own order.
fn map_entries(v: &Value) -> Result<Vec<(Value, Value)>, Error> {
    let mut rv = Vec::new();
    for key in v.try_iter()? {
        let item = v.get_item(&key)?;
        rv.push((key, item));
    }
    Ok(rv)
}

fn key_text(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Number => Ok(number_text(key, true)),
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "keys must be str, int, float, bool or None, not {}",
                key.kind()
            ),
        )),
    }
}

/// Python's `json.dumps(value, ...)` over a template value.
pub(crate) fn dumps(v: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let (item_sep, key_sep) = match &opts.separators {
        Some((i, k)) => (i.clone(), k.clone()),
        None if opts.indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let mut out = String::new();
    dump_into(v, opts, &item_sep, &key_sep, 0, &mut out)?;
    Ok(out)
}

fn newline_indent(opts: &DumpOptions, level: usize, out: &mut String) {
    if let Some(unit) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(unit);
        }
    }
}

fn dump_into(
    v: &Value,
    opts: &DumpOptions,
    item_sep: &str,
    key_sep: &str,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number_text(v, true)),
        ValueKind::String => json_string(v.as_str().unwrap_or_default(), opts.ensure_ascii, out),
        ValueKind::Seq => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline_indent(opts, level + 1, out);
                dump_into(item, opts, item_sep, key_sep, level + 1, out)?;
            }
            newline_indent(opts, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = map_entries(v)?
                .into_iter()
                .map(|(k, val)| Ok((key_text(&k)?, val)))
                .collect::<Result<Vec<_>, Error>>()?;
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (k, val)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline_indent(opts, level + 1, out);
                json_string(k, opts.ensure_ascii, out);
                out.push_str(key_sep);
                dump_into(val, opts, item_sep, key_sep, level + 1, out)?;
            }
            newline_indent(opts, level, out);
            out.push('}');
        }
        ValueKind::Undefined => return Err(type_error("Undefined")),
        _ => return Err(type_error(&v.kind().to_string())),
    }
    Ok(())
}

/// Python's `repr` of a `str`.
pub(crate) fn str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push(quote);
}

/// An approximation of Python's `str.isprintable` for one character: control characters,
/// separators other than the space and unassigned/format code points are not printable.
fn is_printable(c: char) -> bool {
    let u = c as u32;
    if c == ' ' {
        return true;
    }
    if u < 0x20 || (0x7f..0xa1).contains(&u) || u == 0xad {
        return false;
    }
    if c.is_whitespace() {
        return false;
    }
    // Format characters (Cf) that Python refuses to print literally.
    !matches!(u, 0x200b..=0x200f | 0x2028..=0x202e | 0x2060..=0x2064 | 0xfeff)
}

/// Python's `repr` of a template value (a list, a dict, a string inside them, a number, ...).
pub(crate) fn repr(v: &Value, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number_text(v, false)),
        ValueKind::String => str_repr(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&item, out)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, (k, val)) in map_entries(v)?.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(k, out)?;
                out.push_str(": ");
                repr(val, out)?;
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
    Ok(())
}

/// What Jinja2 prints for a value (`str(value)`): strings as they are, containers as `repr`.
pub(crate) fn display(v: &Value) -> Result<String, Error> {
    match v.kind() {
        ValueKind::Seq | ValueKind::Iterable => {
            let mut s = String::new();
            repr(v, &mut s)?;
            Ok(s)
        }
        ValueKind::Map => {
            let mut s = String::new();
            repr(v, &mut s)?;
            Ok(s)
        }
        ValueKind::Number if !v.is_integer() => Ok(number_text(v, false)),
        _ => Ok(v.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are Python 3's repr() of the same floats.
        let cases = [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1.5, "1.5"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.0, "123456789012345.0"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (1e100, "1e+100"),
            (-0.0, "-0.0"),
            (0.3, "0.3"),
            (1.25e-3, "0.00125"),
            (9999999999999998.0, "9999999999999998.0"),
        ];
        for (v, want) in cases {
            assert_eq!(float_repr(v), want, "{v}");
        }
    }

    #[test]
    fn json_strings_escape_like_python() {
        let mut s = String::new();
        json_string("a\"b\\c\n\u{1}é<>&'", false, &mut s);
        assert_eq!(s, "\"a\\\"b\\\\c\\n\\u0001é<>&'\"");
        let mut s = String::new();
        json_string("é😀", true, &mut s);
        assert_eq!(s, "\"\\u00e9\\ud83d\\ude00\"");
    }

    #[test]
    fn repr_quotes_like_python() {
        let mut s = String::new();
        str_repr("it's", &mut s);
        assert_eq!(s, "\"it's\"");
        let mut s = String::new();
        str_repr("say \"hi\" it's", &mut s);
        assert_eq!(s, "'say \"hi\" it\\'s'");
    }
}
