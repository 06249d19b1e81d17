//! The JSON the `BMOE_*` lines are written in: objects whose keys come in the order the spec
//! lists them, floats with the spec's fixed number of decimals; and the reading side, a parsed
//! object whose keys are taken by name.

use std::fmt::Write as _;

use serde_json::{Map, Value};

/// A JSON string literal (quoted and escaped).
pub fn json_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// `v` in JSON's shortest round-trip form (an exact parser gives back the same bits), `null` when
/// not finite.
pub fn json_exact(v: f64) -> String {
    serde_json::Number::from_f64(v).map_or_else(|| "null".to_owned(), |n| n.to_string())
}

/// A JSON object written key by key in the order given. Floats are written with a fixed number
/// of decimals; a value that is not finite becomes `null`.
#[derive(Default)]
pub struct JsonObject {
    s: String,
}

impl JsonObject {
    fn key(&mut self, k: &str) -> &mut String {
        self.s.push(if self.s.is_empty() { '{' } else { ',' });
        self.s.push_str(&json_str(k));
        self.s.push(':');
        &mut self.s
    }

    /// A signed integer.
    pub fn int(&mut self, k: &str, v: i64) -> &mut Self {
        let _ = write!(self.key(k), "{v}");
        self
    }

    /// An unsigned integer.
    pub fn uint(&mut self, k: &str, v: u64) -> &mut Self {
        let _ = write!(self.key(k), "{v}");
        self
    }

    /// `true` or `false`.
    pub fn bool(&mut self, k: &str, v: bool) -> &mut Self {
        let _ = write!(self.key(k), "{v}");
        self
    }

    /// A float with `decimals` decimals (`null` when not finite).
    pub fn float(&mut self, k: &str, v: f64, decimals: usize) -> &mut Self {
        let out = self.key(k);
        if v.is_finite() {
            let _ = write!(out, "{v:.decimals$}");
        } else {
            out.push_str("null");
        }
        self
    }

    /// A string.
    pub fn str(&mut self, k: &str, v: &str) -> &mut Self {
        let v = json_str(v);
        self.key(k).push_str(&v);
        self
    }

    /// A value already written as JSON.
    pub fn raw(&mut self, k: &str, json: &str) -> &mut Self {
        self.key(k).push_str(json);
        self
    }

    /// The object's text.
    pub fn finish(&mut self) -> String {
        if self.s.is_empty() {
            self.s.push('{');
        }
        self.s.push('}');
        std::mem::take(&mut self.s)
    }
}

/// A parsed JSON object whose values are taken by key; the error names the key and what was
/// found there.
pub struct Fields(Map<String, Value>);

impl Fields {
    /// Parses `text` as one JSON object.
    pub fn parse(text: &str) -> Result<Fields, String> {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => Ok(Fields(m)),
            Ok(_) => Err("not a JSON object".to_owned()),
            Err(e) => Err(format!("not valid JSON: {e}")),
        }
    }

    /// Whether `k` is present.
    pub fn has(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }

    fn get(&self, k: &str) -> Result<&Value, String> {
        self.0.get(k).ok_or_else(|| format!("no `{k}`"))
    }

    fn wrong(k: &str, what: &str, v: &Value) -> String {
        format!("`{k}`: expected {what}, found {v}")
    }

    /// A signed integer.
    pub fn int(&self, k: &str) -> Result<i64, String> {
        let v = self.get(k)?;
        v.as_i64().ok_or_else(|| Self::wrong(k, "an integer", v))
    }

    /// An unsigned integer.
    pub fn uint(&self, k: &str) -> Result<u64, String> {
        let v = self.get(k)?;
        v.as_u64()
            .ok_or_else(|| Self::wrong(k, "an unsigned integer", v))
    }

    /// A boolean.
    pub fn bool(&self, k: &str) -> Result<bool, String> {
        let v = self.get(k)?;
        v.as_bool()
            .ok_or_else(|| Self::wrong(k, "true or false", v))
    }

    /// A number (`null`, what a writer makes of a value that is not finite, reads as NaN).
    pub fn float(&self, k: &str) -> Result<f64, String> {
        let v = self.get(k)?;
        if v.is_null() {
            return Ok(f64::NAN);
        }
        v.as_f64().ok_or_else(|| Self::wrong(k, "a number", v))
    }

    /// A string.
    pub fn str(&self, k: &str) -> Result<String, String> {
        let v = self.get(k)?;
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| Self::wrong(k, "a string", v))
    }

    /// An array of numbers, `null` reading as `null_as`.
    pub fn floats(&self, k: &str, null_as: f64) -> Result<Vec<f64>, String> {
        let v = self.get(k)?;
        let items = v.as_array().ok_or_else(|| Self::wrong(k, "an array", v))?;
        items
            .iter()
            .map(|x| {
                if x.is_null() {
                    Ok(null_as)
                } else {
                    x.as_f64()
                        .ok_or_else(|| Self::wrong(k, "numbers or null", x))
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_keep_their_order_and_write_non_finite_as_null() {
        let mut o = JsonObject::default();
        o.int("b", -1)
            .uint("a", 2)
            .float("x", 1.23456, 2)
            .float("n", f64::NAN, 3)
            .str("s", "q\"\n")
            .raw("r", "[1,null]");
        assert_eq!(
            o.finish(),
            r#"{"b":-1,"a":2,"x":1.23,"n":null,"s":"q\"\n","r":[1,null]}"#
        );
        assert_eq!(JsonObject::default().finish(), "{}");
        assert_eq!(json_exact(0.1), "0.1");
        assert_eq!(json_exact(f64::NEG_INFINITY), "null");
    }

    #[test]
    fn fields_say_which_key_is_missing_or_wrong() {
        let f = Fields::parse(r#"{"a":1,"b":"x","c":null,"d":[1.5,null]}"#).unwrap();
        assert_eq!(f.uint("a"), Ok(1));
        assert_eq!(
            f.str("a"),
            Err("`a`: expected a string, found 1".to_owned())
        );
        assert_eq!(f.int("z"), Err("no `z`".to_owned()));
        assert!(f.float("c").unwrap().is_nan());
        assert_eq!(f.floats("d", -1.0), Ok(vec![1.5, -1.0]));
        assert!(Fields::parse("[1]").is_err());
        assert!(Fields::parse("{").is_err());
    }
}
