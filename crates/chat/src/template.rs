//! Rendering a model's chat template the way Hugging Face transformers does.

use std::borrow::Cow;
use std::fmt;

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

use crate::ChatError;
use crate::clock::{Clock, strftime};
use crate::pyfmt;

const TEMPLATE_NAME: &str = "chat_template";

/// The largest `tojson` indent accepted (a hostile template must not make us allocate without
/// bound; real templates use 2 or 4).
const MAX_INDENT: usize = 1024;

/// Data handed to a template (messages, tools, extra variables): JSON with its map order kept,
/// as Python dicts keep theirs (`tojson` and `dict.items()` follow it).
#[derive(Debug, Clone)]
pub struct Data(pub(crate) Value);

impl Data {
    /// Parses JSON text, keeping the order of every object's keys.
    pub fn from_json_str(text: &str) -> Result<Data, ChatError> {
        serde_json::from_str::<Value>(text)
            .map(Data)
            .map_err(|e| ChatError::Data(e.to_string()))
    }

    /// Converts a `serde_json` value. Object keys follow the map's own iteration order (sorted
    /// unless serde_json's `preserve_order` is on); use [`Data::from_json_str`] when the order of
    /// the original text matters.
    pub fn from_json(value: &serde_json::Value) -> Data {
        Data(Value::from_serialize(value))
    }

    /// A string value.
    pub fn string(s: &str) -> Data {
        Data(Value::from(s))
    }

    /// A boolean value.
    pub fn bool(b: bool) -> Data {
        Data(Value::from(b))
    }

    /// The member `key` of an object value.
    pub fn get(&self, key: &str) -> Option<Data> {
        if self.0.kind() != ValueKind::Map {
            return None;
        }
        let v = self.0.get_attr(key).ok()?;
        (!v.is_undefined()).then_some(Data(v))
    }

    /// The elements of an array value (empty for anything else).
    pub fn elements(&self) -> Vec<Data> {
        if self.0.kind() != ValueKind::Seq {
            return Vec::new();
        }
        self.0
            .try_iter()
            .map(|it| it.map(Data).collect())
            .unwrap_or_default()
    }

    /// An array of the given values.
    pub fn array(items: impl IntoIterator<Item = Data>) -> Data {
        Data(Value::from(
            items.into_iter().map(|d| d.0).collect::<Vec<_>>(),
        ))
    }

    /// An object of the given members, in order.
    pub fn object<'k>(members: impl IntoIterator<Item = (&'k str, Data)>) -> Data {
        Data(
            members
                .into_iter()
                .map(|(k, v)| (Value::from(k), v.0))
                .collect(),
        )
    }

    /// The string of a string value.
    pub fn as_str(&self) -> Option<&str> {
        self.0.as_str()
    }

    /// The value of a boolean value.
    pub fn as_bool(&self) -> Option<bool> {
        (self.0.kind() == ValueKind::Bool).then(|| self.0.is_true())
    }

    /// The JSON text of this value (compact, keys in order).
    pub fn to_json_string(&self) -> Result<String, ChatError> {
        pyfmt::dumps(
            &self.0,
            &pyfmt::DumpOptions {
                separators: Some((",".into(), ":".into())),
                ..Default::default()
            },
        )
        .map_err(|e| ChatError::Data(e.to_string()))
    }
}

impl From<&serde_json::Value> for Data {
    fn from(v: &serde_json::Value) -> Data {
        Data::from_json(v)
    }
}

/// One rendering: what the template sees besides `bos_token`/`eos_token`.
#[derive(Debug, Clone)]
pub struct RenderRequest<'a> {
    /// The conversation: a list of message objects (`role`, `content`, and where they apply
    /// `reasoning_content`/`thinking`, `tool_calls`, `tool_call_id`, `name`).
    pub messages: &'a Data,
    /// Tool definitions (`[{"type":"function","function":{...}}]`), or none.
    pub tools: Option<&'a Data>,
    /// Whether to end with the opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// `enable_thinking`, left undefined when `None`.
    pub enable_thinking: Option<bool>,
    /// Further template variables (a model's `chat_template_kwargs`); they override the above.
    pub extra: Vec<(String, Data)>,
}

impl<'a> RenderRequest<'a> {
    /// A request over `messages` with no tools, no generation prompt and thinking undefined.
    pub fn new(messages: &'a Data) -> RenderRequest<'a> {
        RenderRequest {
            messages,
            tools: None,
            add_generation_prompt: false,
            enable_thinking: None,
            extra: Vec::new(),
        }
    }
}

/// The marker attached to the error `raise_exception` produces, to tell it from engine errors.
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    clock: Clock,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("clock", &self.clock)
            .finish()
    }
}

/// Rewrites Hugging Face's `{% generation %}…{% endgeneration %}` (a marker around assistant
/// text that renders its body unchanged) into `{% if true %}…{% endif %}`, which has the same
/// output and the same whitespace control.
fn rewrite_generation_blocks(src: &str) -> Cow<'_, str> {
    if !src.contains("generation") {
        return Cow::Borrowed(src);
    }
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    let mut changed = false;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos]);
        let tag = &rest[pos..];
        let mut i = 2;
        let bytes = tag.as_bytes();
        if i < bytes.len() && (bytes[i] == b'-' || bytes[i] == b'+') {
            i += 1;
        }
        let ws_start = i;
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let word_start = i;
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            i += 1;
        }
        let word = &tag[word_start..i];
        let replacement = match word {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        // Only a bare tag: whitespace, an optional `-`/`+`, then `%}`.
        let mut j = i;
        while j < bytes.len() && bytes[j].is_ascii_whitespace() {
            j += 1;
        }
        if j < bytes.len() && (bytes[j] == b'-' || bytes[j] == b'+') {
            j += 1;
        }
        let closes = tag[j..].starts_with("%}");
        match replacement {
            Some(r) if closes => {
                out.push_str(&tag[..ws_start]);
                out.push(' ');
                out.push_str(r);
                out.push_str(&tag[i..j + 2]);
                rest = &tag[j + 2..];
                changed = true;
            }
            _ => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(src)
    }
}

fn invalid(msg: impl Into<Cow<'static, str>>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg)
}

/// Hugging Face's `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, with no HTML escaping.
fn tojson_filter(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(invalid("tojson() takes at most 4 arguments"));
    }
    let mut params: [Option<Value>; 4] = Default::default();
    for (slot, v) in params.iter_mut().zip(args.iter()) {
        *slot = Some(v.clone());
    }
    for (i, name) in NAMES.iter().enumerate() {
        if kwargs.has(name) {
            if params[i].is_some() {
                return Err(invalid(format!(
                    "tojson() got multiple values for argument '{name}'"
                )));
            }
            params[i] = Some(kwargs.get::<Value>(name)?);
        }
    }
    kwargs.assert_all_used()?;
    let mut opts = pyfmt::DumpOptions::default();
    if let Some(v) = &params[0] {
        opts.ensure_ascii = v.is_true();
    }
    if let Some(v) = &params[1] {
        opts.indent = match v.kind() {
            ValueKind::None | ValueKind::Undefined => None,
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
            ValueKind::Bool => Some(" ".repeat(usize::from(v.is_true()))),
            ValueKind::Number if v.is_integer() => {
                let n = usize::try_from(v.as_i64().unwrap_or(0)).unwrap_or(0);
                if n > MAX_INDENT {
                    return Err(invalid(format!(
                        "tojson(): indent {n} is beyond {MAX_INDENT}"
                    )));
                }
                Some(" ".repeat(n))
            }
            _ => return Err(invalid("tojson(): indent must be an integer or a string")),
        };
    }
    if let Some(v) = &params[2]
        && !v.is_none()
        && !v.is_undefined()
    {
        let parts: Vec<Value> = v.try_iter()?.collect();
        match parts.as_slice() {
            [a, b] => {
                let (Some(a), Some(b)) = (a.as_str(), b.as_str()) else {
                    return Err(invalid("tojson(): separators must be two strings"));
                };
                opts.separators = Some((a.to_owned(), b.to_owned()));
            }
            _ => return Err(invalid("tojson(): separators must be two strings")),
        }
    }
    if let Some(v) = &params[3] {
        opts.sort_keys = v.is_true();
    }
    pyfmt::dumps(value, &opts).map(Value::from)
}

/// Jinja2's `string` filter: Python's `str()`.
fn string_filter(value: &Value) -> Result<Value, Error> {
    if value.kind() == ValueKind::String {
        return Ok(value.clone());
    }
    pyfmt::display(value).map(Value::from)
}

/// Jinja2's `iterable` test: whether Python's `iter()` accepts the value (`None` and numbers
/// are not iterable; an undefined value is).
fn is_iterable(value: &Value) -> bool {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Invalid => false,
        ValueKind::Undefined | ValueKind::String | ValueKind::Bytes => true,
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => true,
        _ => value.try_iter().is_ok(),
    }
}

/// Jinja2's `sequence` test: the value has a length and item access (strings and dicts do,
/// and so does an undefined value; `None` and numbers do not).
fn is_sequence(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Undefined
            | ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Seq
            | ValueKind::Map
    )
}

/// Python methods called on template values: minijinja-contrib's `pycompat`, plus the ones it
/// lacks.
fn python_method(
    state: &minijinja::State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if method == "rsplit"
        && let Some(s) = value.as_str()
    {
        return rsplit(s, args);
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Python's `str.rsplit(sep=None, maxsplit=-1)`.
fn rsplit(s: &str, args: &[Value]) -> Result<Value, Error> {
    let sep = match args.first() {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some("") => return Err(invalid("empty separator")),
            Some(sep) => Some(sep.to_owned()),
            None => return Err(invalid("rsplit(): separator must be a string or None")),
        },
    };
    let maxsplit = match args.get(1) {
        Some(v) => v
            .as_i64()
            .ok_or_else(|| invalid("rsplit(): maxsplit must be an integer"))?,
        None => -1,
    };
    let limit = usize::try_from(maxsplit).ok();
    let mut parts: Vec<String> = Vec::new();
    match sep {
        Some(sep) => {
            let mut rest = s;
            while limit.is_none_or(|l| parts.len() < l) {
                match rest.rfind(sep.as_str()) {
                    Some(i) => {
                        parts.push(rest[i + sep.len()..].to_owned());
                        rest = &rest[..i];
                    }
                    None => break,
                }
            }
            parts.push(rest.to_owned());
        }
        None => {
            let mut rest = s.trim_end();
            while !rest.is_empty() {
                if limit.is_some_and(|l| parts.len() >= l) {
                    parts.push(rest.to_owned());
                    break;
                }
                match rest.rfind(char::is_whitespace) {
                    Some(i) => {
                        let ws_len = rest[i..].chars().next().map_or(1, char::len_utf8);
                        parts.push(rest[i + ws_len..].to_owned());
                        rest = rest[..i].trim_end();
                    }
                    None => {
                        parts.push(rest.to_owned());
                        break;
                    }
                }
            }
        }
    }
    parts.reverse();
    Ok(Value::from(parts))
}

/// Jinja2's `truncate(s, length=255, killwords=False, end='...', leeway=None)`, positional
/// arguments included (minijinja-contrib's takes keywords only).
fn truncate_filter(
    state: &minijinja::State,
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["length", "killwords", "end", "leeway"];
    if args.len() > NAMES.len() {
        return Err(invalid("truncate() takes at most 4 arguments"));
    }
    let mut all: Vec<(String, Value)> = NAMES
        .iter()
        .zip(args.iter())
        .map(|(n, v)| ((*n).to_owned(), v.clone()))
        .collect();
    for name in kwargs.args() {
        all.push((name.to_owned(), kwargs.get::<Value>(name)?));
    }
    minijinja_contrib::filters::truncate(state, value, all.into_iter().collect())
}

/// Jinja2's `wordcount`: the number of `\w+` runs.
fn wordcount_filter(value: &Value) -> Result<Value, Error> {
    let s = value.to_string();
    let mut count = 0usize;
    let mut in_word = false;
    for c in s.chars() {
        let w = c.is_alphanumeric() || c == '_';
        if w && !in_word {
            count += 1;
        }
        in_word = w;
    }
    Ok(Value::from(count))
}

/// Jinja2's `length`: Python's `len()`, which is 0 for an undefined value.
fn length_filter(value: &Value) -> Result<Value, Error> {
    if value.is_undefined() {
        return Ok(Value::from(0));
    }
    value
        .len()
        .map(Value::from)
        .ok_or_else(|| invalid(format!("object of type '{}' has no len()", value.kind())))
}

fn raise_exception(msg: Option<Value>) -> Result<Value, Error> {
    let text = msg.map(|m| m.to_string()).unwrap_or_default();
    Err(invalid(text.clone()).with_source(Raised(text)))
}

fn build_env(source: &str, clock: Clock) -> Result<Environment<'static>, ChatError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(python_method);
    // Filters Jinja2 has that minijinja keeps in its contrib crate.
    env.add_filter("truncate", truncate_filter);
    env.add_filter("filesizeformat", minijinja_contrib::filters::filesizeformat);
    env.add_filter("striptags", minijinja_contrib::filters::striptags);
    env.add_filter("wordcount", wordcount_filter);
    env.add_function("cycler", minijinja_contrib::globals::cycler);
    env.add_function("joiner", minijinja_contrib::globals::joiner);
    env.add_test("iterable", is_iterable);
    env.add_test("sequence", is_sequence);
    env.add_filter("tojson", tojson_filter);
    env.add_filter("string", string_filter);
    env.add_filter("length", length_filter);
    env.add_filter("count", length_filter);
    env.add_function("raise_exception", raise_exception);
    env.add_function(
        "strftime_now",
        move |format: &str| -> Result<Value, Error> {
            Ok(Value::from(strftime(format, clock.now_unix())))
        },
    );
    // Print what Jinja2 prints: containers as Python's repr, floats as Python's repr.
    env.set_formatter(|out, state, value| match value.kind() {
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map | ValueKind::Number => {
            let text = pyfmt::display(value)?;
            out.write_str(&text).map_err(Error::from)
        }
        _ => minijinja::escape_formatter(out, state, value),
    });
    let src = rewrite_generation_blocks(source).into_owned();
    env.add_template_owned(TEMPLATE_NAME, src)
        .map_err(|e| ChatError::Syntax(error_text(&e)))?;
    Ok(env)
}

fn error_text(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

fn raised_message(e: &Error) -> Option<String> {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(r) = s.downcast_ref::<Raised>() {
            return Some(r.0.clone());
        }
        src = s.source();
    }
    None
}

/// What transformers' `apply_chat_template` does to messages before the template sees them:
/// keys whose value is none are dropped (`content: null` on a tool call reads as absent), and
/// the first of `reasoning_content`, `thinking`, `reasoning` that is set fills both `thinking`
/// (gpt-oss and LFM2.5 read it) and `reasoning_content` (most others read that).
fn normalize_messages(messages: &Value) -> Result<Value, Error> {
    if messages.kind() != ValueKind::Seq {
        return Ok(messages.clone());
    }
    let mut out = Vec::new();
    for msg in messages.try_iter()? {
        if msg.kind() != ValueKind::Map {
            out.push(msg);
            continue;
        }
        let mut kept = Vec::new();
        let mut dropped = false;
        for key in msg.try_iter()? {
            let v = msg.get_item(&key)?;
            if v.is_none() {
                dropped = true;
            } else {
                kept.push((key, v));
            }
        }
        let msg: Value = if dropped {
            kept.into_iter().collect()
        } else {
            msg
        };
        let mut reasoning = None;
        for key in ["reasoning_content", "thinking", "reasoning"] {
            let v = msg.get_attr(key)?;
            if !v.is_undefined() && !v.is_none() {
                reasoning = Some(v);
                break;
            }
        }
        let Some(r) = reasoning else {
            out.push(msg);
            continue;
        };
        let mut entries: Vec<(Value, Value)> = vec![(Value::from("thinking"), r.clone())];
        for key in msg.try_iter()? {
            let v = msg.get_item(&key)?;
            if let Some(slot) = entries.iter_mut().find(|(k, _)| *k == key) {
                slot.1 = v;
            } else {
                entries.push((key, v));
            }
        }
        let rc = Value::from("reasoning_content");
        if let Some(slot) = entries.iter_mut().find(|(k, _)| *k == rc) {
            slot.1 = r;
        } else {
            entries.push((rc, r));
        }
        out.push(entries.into_iter().collect());
    }
    Ok(Value::from(out))
}

impl ChatTemplate {
    /// Compiles `source` (a `tokenizer.chat_template`) with the model's BOS/EOS token texts.
    /// `strftime_now` reads the system clock; see [`ChatTemplate::with_clock`].
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ChatError> {
        Ok(ChatTemplate {
            env: build_env(source, Clock::System)?,
            source: source.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            clock: Clock::System,
        })
    }

    /// The same template with `strftime_now` reading `clock`.
    pub fn with_clock(self, clock: Clock) -> Result<ChatTemplate, ChatError> {
        Ok(ChatTemplate {
            env: build_env(&self.source, clock)?,
            clock,
            ..self
        })
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The BOS token text the template sees.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS token text the template sees.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// `text` without a leading BOS token text: for a tokenizer that adds BOS itself, so the
    /// prompt does not start with two (llama.cpp strips it the same way).
    pub fn strip_leading_bos<'t>(&self, text: &'t str) -> &'t str {
        if self.bos_token.is_empty() {
            return text;
        }
        text.strip_prefix(self.bos_token.as_str()).unwrap_or(text)
    }

    /// Renders a conversation. Variables: `messages` (normalized as transformers'
    /// `apply_chat_template` does: none-valued keys dropped, reasoning aliased),
    /// `tools` and `documents` (none unless given), `add_generation_prompt`, `bos_token`,
    /// `eos_token`, `enable_thinking` when set, then `extra`.
    pub fn render(&self, req: &RenderRequest<'_>) -> Result<String, ChatError> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::Syntax(error_text(&e)))?;
        let messages =
            normalize_messages(&req.messages.0).map_err(|e| ChatError::Render(error_text(&e)))?;
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), messages),
            (
                "tools".into(),
                req.tools.map_or(Value::from(()), |t| t.0.clone()),
            ),
            ("documents".into(), Value::from(())),
            (
                "add_generation_prompt".into(),
                Value::from(req.add_generation_prompt),
            ),
            ("bos_token".into(), Value::from(self.bos_token.as_str())),
            ("eos_token".into(), Value::from(self.eos_token.as_str())),
        ];
        if let Some(t) = req.enable_thinking {
            ctx.push(("enable_thinking".into(), Value::from(t)));
        }
        for (k, v) in &req.extra {
            if let Some(slot) = ctx.iter_mut().find(|(name, _)| name == k) {
                slot.1 = v.0.clone();
            } else {
                ctx.push((k.clone(), v.0.clone()));
            }
        }
        let ctx: Value = ctx.into_iter().collect();
        tmpl.render(ctx).map_err(|e| match raised_message(&e) {
            Some(msg) => ChatError::Raised(msg),
            None => ChatError::Render(error_text(&e)),
        })
    }
}

/// Picks the template to use among a model's `tokenizer.chat_template` (`default`) and its
/// named ones (`tokenizer.chat_template.<name>`): `wanted` names one of them (`"default"` or
/// `None` means the default, falling back to a named `default`).
pub fn select_template<'a>(
    default: Option<&'a str>,
    named: &[(&'a str, &'a str)],
    wanted: Option<&str>,
) -> Result<&'a str, ChatError> {
    let find = |name: &str| named.iter().find(|(n, _)| *n == name).map(|(_, s)| *s);
    match wanted {
        None | Some("default") => default
            .or_else(|| find("default"))
            .ok_or(ChatError::NoTemplate),
        Some(name) => find(name).ok_or_else(|| ChatError::UnknownTemplate {
            wanted: name.to_owned(),
            available: named.iter().map(|(n, _)| (*n).to_owned()).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_if_blocks() {
        let src = "a{%- generation -%}b{% endgeneration %}c{%+generation+%}{%-endgeneration-%}";
        assert_eq!(
            rewrite_generation_blocks(src),
            "a{%- if true -%}b{% endif %}c{%+ if true+%}{%- endif-%}"
        );
        let keep = "{% if generation %}{{ generation }}{% endif %}";
        assert_eq!(rewrite_generation_blocks(keep), keep);
    }
}
