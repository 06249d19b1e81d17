//! Typed reads of `{arch}.*` metadata keys, with errors that name the key.

use gguf::{ArrayValue, Metadata, Value};

use crate::error::ModelError;
use crate::params::{KEY_TOKENS, PerLayer};

/// The metadata of a file, read under one architecture's key prefix.
pub(crate) struct Kv<'m> {
    /// All metadata.
    pub(crate) md: &'m Metadata,
    /// The architecture's name: keys are `{prefix}.{suffix}`.
    pub(crate) prefix: &'static str,
}

/// A value's type, with an array's element type.
pub(crate) fn value_type_name(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("array of {}", a.elem_type()),
        v => v.value_type().to_string(),
    }
}

fn int_to_u32(key: &str, v: &Value) -> Result<u32, ModelError> {
    let n = v.as_u64().ok_or_else(|| ModelError::KeyType {
        key: key.to_owned(),
        expected: "unsigned integer",
        found: value_type_name(v),
    })?;
    u32::try_from(n).map_err(|_| ModelError::InvalidValue {
        key: key.to_owned(),
        reason: format!("{n} does not fit in 32 bits"),
    })
}

impl Kv<'_> {
    pub(crate) fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }

    pub(crate) fn u32(&self, key: &str) -> Result<Option<u32>, ModelError> {
        match self.md.get(key) {
            None => Ok(None),
            Some(v) => int_to_u32(key, v).map(Some),
        }
    }

    pub(crate) fn u32_req(&self, key: &str) -> Result<u32, ModelError> {
        self.u32(key)?
            .ok_or_else(|| ModelError::MissingKey(key.to_owned()))
    }

    pub(crate) fn f32(&self, key: &str) -> Result<Option<f32>, ModelError> {
        match self.md.get(key) {
            None => Ok(None),
            Some(Value::F32(v)) => Ok(Some(*v)),
            Some(Value::F64(v)) => Ok(Some(*v as f32)),
            Some(v) => Err(ModelError::KeyType {
                key: key.to_owned(),
                expected: "float",
                found: value_type_name(v),
            }),
        }
    }

    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        match self.md.get(key) {
            None => Ok(None),
            Some(Value::Bool(v)) => Ok(Some(*v)),
            Some(v) => Err(ModelError::KeyType {
                key: key.to_owned(),
                expected: "bool",
                found: value_type_name(v),
            }),
        }
    }

    pub(crate) fn str(&self, key: &str) -> Result<Option<&str>, ModelError> {
        match self.md.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ModelError::KeyType {
                key: key.to_owned(),
                expected: "string",
                found: value_type_name(v),
            }),
        }
    }

    /// The vocabulary size: the token list's length (it wins, as in llama.cpp), else
    /// `{arch}.vocab_size` for files without one; never 0.
    pub(crate) fn n_vocab(&self) -> Result<u32, ModelError> {
        let n_vocab = match self.md.get(KEY_TOKENS) {
            Some(Value::Array(a)) => u32::try_from(a.len())
                .map_err(|_| invalid(KEY_TOKENS.to_owned(), "more than 2^32 tokens"))?,
            Some(v) => {
                return Err(ModelError::KeyType {
                    key: KEY_TOKENS.to_owned(),
                    expected: "array of strings",
                    found: value_type_name(v),
                });
            }
            None => self.u32(&self.key("vocab_size"))?.ok_or_else(|| {
                ModelError::MissingKey(format!("{KEY_TOKENS} (or {})", self.key("vocab_size")))
            })?,
        };
        if n_vocab == 0 {
            return Err(invalid(self.key("vocab_size"), "the vocabulary is empty"));
        }
        Ok(n_vocab)
    }

    /// A scalar repeated per layer, or an array of exactly `n_layer` integers.
    pub(crate) fn per_layer(
        &self,
        key: &str,
        n_layer: u32,
    ) -> Result<Option<PerLayer>, ModelError> {
        let n = n_layer as usize;
        match self.md.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => {
                if a.len() != n {
                    return Err(ModelError::ArrayLength {
                        key: key.to_owned(),
                        expected: n,
                        found: a.len(),
                    });
                }
                let bad = || ModelError::KeyType {
                    key: key.to_owned(),
                    expected: "unsigned integer or array of integers",
                    found: format!("array of {}", a.elem_type()),
                };
                if matches!(
                    a,
                    ArrayValue::F32(_)
                        | ArrayValue::F64(_)
                        | ArrayValue::Bool(_)
                        | ArrayValue::String(_)
                        | ArrayValue::Array(_)
                ) {
                    return Err(bad());
                }
                let mut out = Vec::with_capacity(n);
                for i in 0..n {
                    let v = a.get(i).ok_or_else(bad)?;
                    out.push(int_to_u32(key, &v)?);
                }
                Ok(Some(PerLayer(out)))
            }
            Some(_) => Ok(self.u32(key)?.map(|v| PerLayer(vec![v; n]))),
        }
    }
}

/// An invalid value of `key`.
pub(crate) fn invalid(key: String, reason: impl Into<String>) -> ModelError {
    ModelError::InvalidValue {
        key,
        reason: reason.into(),
    }
}
