//! Metadata values.

use std::collections::HashMap;
use std::fmt;

/// The value type ids of GGUF metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// u8
    U8 = 0,
    /// i8
    I8 = 1,
    /// u16
    U16 = 2,
    /// i16
    I16 = 3,
    /// u32
    U32 = 4,
    /// i32
    I32 = 5,
    /// f32
    F32 = 6,
    /// bool (one byte, 0 or 1)
    Bool = 7,
    /// UTF-8 string with a u64 length prefix
    String = 8,
    /// array: element type (u32), length (u64), elements
    Array = 9,
    /// u64
    U64 = 10,
    /// i64
    I64 = 11,
    /// f64
    F64 = 12,
}

impl ValueType {
    /// The type for an id, if valid.
    pub fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The id stored in the file.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The fewest bytes one value of this type occupies in a file.
    pub(crate) fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 4 + 8,
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// u8
    U8(u8),
    /// i8
    I8(i8),
    /// u16
    U16(u16),
    /// i16
    I16(i16),
    /// u32
    U32(u32),
    /// i32
    I32(i32),
    /// u64
    U64(u64),
    /// i64
    I64(i64),
    /// f32
    F32(f32),
    /// f64
    F64(f64),
    /// bool
    Bool(bool),
    /// string
    String(String),
    /// array (typed, possibly nested)
    Array(ArrayValue),
}

/// An array value. Every variant keeps its element type, also when empty; an array of
/// arrays holds inner arrays that each carry their own element type.
#[derive(Debug, Clone, PartialEq)]
pub enum ArrayValue {
    /// u8 elements
    U8(Vec<u8>),
    /// i8 elements
    I8(Vec<i8>),
    /// u16 elements
    U16(Vec<u16>),
    /// i16 elements
    I16(Vec<i16>),
    /// u32 elements
    U32(Vec<u32>),
    /// i32 elements
    I32(Vec<i32>),
    /// u64 elements
    U64(Vec<u64>),
    /// i64 elements
    I64(Vec<i64>),
    /// f32 elements
    F32(Vec<f32>),
    /// f64 elements
    F64(Vec<f64>),
    /// bool elements
    Bool(Vec<bool>),
    /// string elements
    String(Vec<String>),
    /// nested arrays
    Array(Vec<ArrayValue>),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
        }
    }

    /// Any integer value that is non-negative, widened to u64.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value that fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// An f32 or f64 value, as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array, if this is an array.
    pub fn as_array(&self) -> Option<&ArrayValue> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl ArrayValue {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            ArrayValue::U8(_) => ValueType::U8,
            ArrayValue::I8(_) => ValueType::I8,
            ArrayValue::U16(_) => ValueType::U16,
            ArrayValue::I16(_) => ValueType::I16,
            ArrayValue::U32(_) => ValueType::U32,
            ArrayValue::I32(_) => ValueType::I32,
            ArrayValue::U64(_) => ValueType::U64,
            ArrayValue::I64(_) => ValueType::I64,
            ArrayValue::F32(_) => ValueType::F32,
            ArrayValue::F64(_) => ValueType::F64,
            ArrayValue::Bool(_) => ValueType::Bool,
            ArrayValue::String(_) => ValueType::String,
            ArrayValue::Array(_) => ValueType::Array,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            ArrayValue::U8(v) => v.len(),
            ArrayValue::I8(v) => v.len(),
            ArrayValue::U16(v) => v.len(),
            ArrayValue::I16(v) => v.len(),
            ArrayValue::U32(v) => v.len(),
            ArrayValue::I32(v) => v.len(),
            ArrayValue::U64(v) => v.len(),
            ArrayValue::I64(v) => v.len(),
            ArrayValue::F32(v) => v.len(),
            ArrayValue::F64(v) => v.len(),
            ArrayValue::Bool(v) => v.len(),
            ArrayValue::String(v) => v.len(),
            ArrayValue::Array(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An empty array of the given element type.
    pub fn empty(elem: ValueType) -> ArrayValue {
        match elem {
            ValueType::U8 => ArrayValue::U8(Vec::new()),
            ValueType::I8 => ArrayValue::I8(Vec::new()),
            ValueType::U16 => ArrayValue::U16(Vec::new()),
            ValueType::I16 => ArrayValue::I16(Vec::new()),
            ValueType::U32 => ArrayValue::U32(Vec::new()),
            ValueType::I32 => ArrayValue::I32(Vec::new()),
            ValueType::U64 => ArrayValue::U64(Vec::new()),
            ValueType::I64 => ArrayValue::I64(Vec::new()),
            ValueType::F32 => ArrayValue::F32(Vec::new()),
            ValueType::F64 => ArrayValue::F64(Vec::new()),
            ValueType::Bool => ArrayValue::Bool(Vec::new()),
            ValueType::String => ArrayValue::String(Vec::new()),
            ValueType::Array => ArrayValue::Array(Vec::new()),
        }
    }

    /// Depth of nesting: 1 for an array of scalars or strings (or an empty array of arrays).
    pub fn depth(&self) -> usize {
        match self {
            ArrayValue::Array(v) => 1 + v.iter().map(ArrayValue::depth).max().unwrap_or(0),
            _ => 1,
        }
    }

    /// Element `i` as a [`Value`] (cloned; an inner array of a nested array is cloned whole).
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            ArrayValue::U8(v) => Value::U8(*v.get(i)?),
            ArrayValue::I8(v) => Value::I8(*v.get(i)?),
            ArrayValue::U16(v) => Value::U16(*v.get(i)?),
            ArrayValue::I16(v) => Value::I16(*v.get(i)?),
            ArrayValue::U32(v) => Value::U32(*v.get(i)?),
            ArrayValue::I32(v) => Value::I32(*v.get(i)?),
            ArrayValue::U64(v) => Value::U64(*v.get(i)?),
            ArrayValue::I64(v) => Value::I64(*v.get(i)?),
            ArrayValue::F32(v) => Value::F32(*v.get(i)?),
            ArrayValue::F64(v) => Value::F64(*v.get(i)?),
            ArrayValue::Bool(v) => Value::Bool(*v.get(i)?),
            ArrayValue::String(v) => Value::String(v.get(i)?.clone()),
            ArrayValue::Array(v) => Value::Array(v.get(i)?.clone()),
        })
    }

    /// The strings, if this is an array of strings.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            ArrayValue::String(v) => Some(v),
            _ => None,
        }
    }
}

/// File metadata: key/value pairs in file order with lookup by key.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

macro_rules! typed_getter {
    ($($(#[$doc:meta])* $fn:ident -> $t:ty = $variant:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $fn(&self, key: &str) -> Option<$t> {
                match self.get(key)? {
                    Value::$variant(v) => Some(*v),
                    _ => None,
                }
            }
        )*
    };
}

impl Metadata {
    /// Insert a new key; returns false (and changes nothing) when the key exists.
    pub(crate) fn insert_new(&mut self, key: String, value: Value) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// Set a key, replacing the value in place when it exists.
    pub(crate) fn set(&mut self, key: &str, value: Value) {
        match self.index.get(key) {
            Some(&i) => {
                if let Some(e) = self.entries.get_mut(i) {
                    e.1 = value;
                }
            }
            None => {
                self.insert_new(key.to_owned(), value);
            }
        }
    }

    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value of a key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let &i = self.index.get(key)?;
        self.entries.get(i).map(|(_, v)| v)
    }

    typed_getter! {
        /// A u8 value (exact type).
        get_u8 -> u8 = U8;
        /// An i8 value (exact type).
        get_i8 -> i8 = I8;
        /// A u16 value (exact type).
        get_u16 -> u16 = U16;
        /// An i16 value (exact type).
        get_i16 -> i16 = I16;
        /// A u32 value (exact type).
        get_u32 -> u32 = U32;
        /// An i32 value (exact type).
        get_i32 -> i32 = I32;
        /// A u64 value (exact type).
        get_u64 -> u64 = U64;
        /// An i64 value (exact type).
        get_i64 -> i64 = I64;
        /// An f32 value (exact type).
        get_f32 -> f32 = F32;
        /// An f64 value (exact type).
        get_f64 -> f64 = F64;
        /// A bool value.
        get_bool -> bool = Bool;
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// An array value.
    pub fn get_array(&self, key: &str) -> Option<&ArrayValue> {
        self.get(key)?.as_array()
    }
}

impl<'a> IntoIterator for &'a Metadata {
    type Item = (&'a str, &'a Value);
    type IntoIter = Box<dyn ExactSizeIterator<Item = (&'a str, &'a Value)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}
