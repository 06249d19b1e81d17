//! The OpenAI API's requests and answers: parsing and checking the bodies of
//! `/v1/chat/completions` and `/v1/completions`, the errors in OpenAI's shape, the stop
//! sequences, and the JSON of responses and stream chunks.

use serde_json::{Map, Value, json};

/// An error answer: status, message, OpenAI's `type` and `code`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        let (kind, code) = match status {
            400 | 411 | 413 | 431 => ("invalid_request_error", None),
            401 => ("authentication_error", Some("invalid_api_key")),
            403 => ("permission_error", None),
            404 => ("not_found_error", None),
            405 => ("invalid_request_error", Some("method_not_allowed")),
            429 => ("rate_limit_error", Some("queue_full")),
            503 => ("unavailable_error", None),
            _ => ("server_error", None),
        };
        ApiError {
            status,
            message: message.into(),
            kind,
            code,
        }
    }

    /// A 400 for a bad request body.
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(400, message)
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// `{"error":{"message","type","code"}}`.
    pub fn body(&self) -> String {
        json!({"error": {"message": self.message, "type": self.kind, "code": self.code}})
            .to_string()
    }
}

/// The request's JSON field that sets `s`, when a request can set it.
pub fn json_field(s: runtime::Setting) -> Option<&'static str> {
    match s {
        runtime::Setting::Seed => Some("seed"),
        _ => None,
    }
}

/// A refusal of a request as the API's error, classified by its variant: a prompt that does
/// not fit is `context_length_exceeded`, anything else a plain 400. Settings a request sets
/// are named by their JSON field, the server's own by the runtime's name.
pub fn refusal_error(r: &runtime::Refusal) -> ApiError {
    let msg = r.render(|s| match s {
        runtime::Setting::Context => "set by the server".into(),
        s => json_field(s).unwrap_or(s.name()).into(),
    });
    let err = ApiError::bad(msg);
    match r {
        runtime::Refusal::ContextFull { .. } => err.with_code("context_length_exceeded"),
        _ => err,
    }
}

/// The sampling settings a request may give; each left out takes the server's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub seed: Option<u32>,
}

impl Sampling {
    /// The sampler's settings: the server's `base` with this request's.
    pub fn apply(&self, base: &sampler::SamplerParams) -> sampler::SamplerParams {
        sampler::SamplerParams {
            temp: self.temperature.unwrap_or(base.temp),
            top_k: self.top_k.unwrap_or(base.top_k),
            top_p: self.top_p.unwrap_or(base.top_p),
            min_p: self.min_p.unwrap_or(base.min_p),
            seed: self.seed.unwrap_or(base.seed),
        }
    }
}

/// What either endpoint's request asks beyond its prompt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Common {
    /// Tokens at most (`max_tokens` / `max_completion_tokens`); `None`: the server's.
    pub max_tokens: Option<i64>,
    pub sampling: Sampling,
    /// Stop sequences (at most 4).
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// llama-server's extension: never draw an end-of-generation token.
    pub ignore_eos: bool,
    /// llama-server's extension (default true): re-use the context's matching prefix; false
    /// prefills the whole prompt, which answers exactly as a fresh run does.
    pub cache_prompt: bool,
}

/// A `/v1/chat/completions` request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatParams {
    /// (role, text); roles `system`, `user`, `assistant` (`developer` is read as `system`).
    pub messages: Vec<(&'static str, String)>,
    /// Whether a reasoning model reasons (`chat_template_kwargs.enable_thinking`, or
    /// `reasoning_effort` "none" for no).
    pub think: Option<bool>,
    pub common: Common,
}

/// A `/v1/completions` request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CompletionParams {
    pub prompt: String,
    pub common: Common,
}

/// The body as a JSON object.
fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad(format!("the body is not UTF-8: {e}")))?;
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::bad("the body must be a JSON object")),
        Err(e) => Err(ApiError::bad(format!("the body is not valid JSON: {e}"))),
    }
}

/// A JSON value's kind, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Reads the typed fields of a request object; `null` counts as left out.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    /// `key` read by `read` and kept when in `lo..=hi`; a value of another kind or out of
    /// range is refused naming the key, the range and what came (`what`: "a number").
    fn ranged<T: PartialOrd + std::fmt::Display>(
        &self,
        key: &str,
        (lo, hi): (T, T),
        what: &str,
        read: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<T>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match read(v) {
                Some(x) if lo <= x && x <= hi => Ok(Some(x)),
                _ => Err(ApiError::bad(format!(
                    "\"{key}\" must be {what} from {lo} to {hi}, got {v}"
                ))),
            },
        }
    }

    fn number(&self, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        self.ranged(key, (lo, hi), "a number", Value::as_f64)
    }

    fn integer(&self, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        self.ranged(key, (lo, hi), "an integer", Value::as_i64)
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::bad(format!(
                "\"{key}\" must be true or false, got {}",
                kind(v)
            ))),
        }
    }

    /// What both endpoints share.
    fn common(&self) -> Result<Common, ApiError> {
        if let Some(n) = self.integer("n", 1, i64::MAX)?
            && n != 1
        {
            return Err(ApiError::bad("only \"n\": 1 is supported"));
        }
        let max_tokens = match self.integer("max_completion_tokens", 1, i64::from(i32::MAX))? {
            Some(n) => Some(n),
            None => self.integer("max_tokens", 1, i64::from(i32::MAX))?,
        };
        let stop = match self.get("stop") {
            None => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(ApiError::bad(format!(
                        "\"stop\" must hold strings, got {}",
                        kind(v)
                    ))),
                })
                .collect::<Result<_, _>>()?,
            Some(v) => {
                return Err(ApiError::bad(format!(
                    "\"stop\" must be a string or an array of strings, got {}",
                    kind(v)
                )));
            }
        };
        if stop.len() > 4 {
            return Err(ApiError::bad("\"stop\" holds at most 4 sequences"));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::bad("a \"stop\" sequence is empty"));
        }
        let include_usage = match self.get("stream_options") {
            None => false,
            Some(Value::Object(o)) => Fields(o).boolean("include_usage")?.unwrap_or(false),
            Some(v) => {
                return Err(ApiError::bad(format!(
                    "\"stream_options\" must be an object, got {}",
                    kind(v)
                )));
            }
        };
        Ok(Common {
            max_tokens,
            sampling: Sampling {
                temperature: self.number("temperature", 0.0, 100.0)?.map(|x| x as f32),
                top_p: self.number("top_p", 0.0, 1.0)?.map(|x| x as f32),
                top_k: self
                    .integer("top_k", 0, i64::from(i32::MAX))?
                    .map(|x| x as i32),
                min_p: self.number("min_p", 0.0, 1.0)?.map(|x| x as f32),
                seed: self
                    .integer("seed", i64::MIN, i64::MAX)?
                    // OpenAI's seed is any integer; the sampler's is 32 bits.
                    .map(|s| s as u32),
            },
            stop,
            stream: self.boolean("stream")?.unwrap_or(false),
            include_usage,
            ignore_eos: self.boolean("ignore_eos")?.unwrap_or(false),
            cache_prompt: self.boolean("cache_prompt")?.unwrap_or(true),
        })
    }
}

/// A message's text: a string, or an array of `{"type":"text","text":...}` parts.
fn content(i: usize, v: Option<&Value>) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some(image @ ("image_url" | "image" | "input_image")), _) => {
                        return Err(ApiError::bad(format!(
                            "message {i}: images are not supported (a content part of type \
                             {image:?}); sluice runs the text model only"
                        )));
                    }
                    (Some(other), _) if other != "text" => {
                        return Err(ApiError::bad(format!(
                            "message {i}: content parts of type {other:?} are not supported \
                             (text only)"
                        )));
                    }
                    _ => {
                        return Err(ApiError::bad(format!(
                            "message {i}: a content part must be {{\"type\":\"text\",\"text\":...}}"
                        )));
                    }
                }
            }
            Ok(text)
        }
        Some(v) => Err(ApiError::bad(format!(
            "message {i}: \"content\" must be a string or an array of parts, got {}",
            kind(v)
        ))),
    }
}

/// Parses and checks a `/v1/chat/completions` body.
pub fn parse_chat(body: &[u8]) -> Result<ChatParams, ApiError> {
    let o = object(body)?;
    let f = Fields(&o);
    let Some(Value::Array(list)) = f.get("messages") else {
        return Err(ApiError::bad("\"messages\" must be an array of messages"));
    };
    if list.is_empty() {
        return Err(ApiError::bad("\"messages\" is empty"));
    }
    let mut messages = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(ApiError::bad(format!("message {i} is not an object")));
        };
        let role = match m.get("role").and_then(Value::as_str) {
            Some("system" | "developer") => "system",
            Some("user") => "user",
            Some("assistant") => "assistant",
            Some(r) => {
                return Err(ApiError::bad(format!(
                    "message {i}: role {r:?} is not supported (system, developer, user, assistant)"
                )));
            }
            None => return Err(ApiError::bad(format!("message {i} has no \"role\""))),
        };
        let text = content(i, m.get("content"))?;
        if text.contains('\0') {
            return Err(ApiError::bad(format!(
                "message {i} contains a NUL character"
            )));
        }
        messages.push((role, text));
    }
    if f.get("tools")
        .is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty()))
    {
        return Err(ApiError::bad("\"tools\" are not supported"));
    }
    let mut think = match f.get("chat_template_kwargs") {
        None => None,
        Some(Value::Object(k)) => Fields(k).boolean("enable_thinking")?,
        Some(v) => {
            return Err(ApiError::bad(format!(
                "\"chat_template_kwargs\" must be an object, got {}",
                kind(v)
            )));
        }
    };
    if think.is_none() {
        think = match f.get("reasoning_effort") {
            None => None,
            Some(Value::String(e)) if e == "none" => Some(false),
            Some(Value::String(e))
                if ["minimal", "low", "medium", "high"].contains(&e.as_str()) =>
            {
                Some(true)
            }
            Some(v) => {
                return Err(ApiError::bad(format!(
                    "\"reasoning_effort\" must be none, minimal, low, medium or high, got {v}"
                )));
            }
        };
    }
    Ok(ChatParams {
        messages,
        think,
        common: f.common()?,
    })
}

/// Parses and checks a `/v1/completions` body.
pub fn parse_completion(body: &[u8]) -> Result<CompletionParams, ApiError> {
    let o = object(body)?;
    let f = Fields(&o);
    let prompt = match f.get("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or_default().to_owned()
        }
        Some(Value::Array(_)) => {
            return Err(ApiError::bad(
                "\"prompt\" must be one string (batches are not supported)",
            ));
        }
        Some(v) => {
            return Err(ApiError::bad(format!(
                "\"prompt\" must be a string, got {}",
                kind(v)
            )));
        }
        None => return Err(ApiError::bad("the request needs a \"prompt\"")),
    };
    if prompt.contains('\0') {
        return Err(ApiError::bad("the prompt contains a NUL character"));
    }
    if f.boolean("echo")?.unwrap_or(false) {
        return Err(ApiError::bad("\"echo\" is not supported"));
    }
    Ok(CompletionParams {
        prompt,
        common: f.common()?,
    })
}

/// Stop sequences over a text that arrives in pieces: what may be passed on is released, what
/// could still be the start of a stop sequence is held back, and a sequence ends the text
/// before it.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops,
            held: String::new(),
            stopped: false,
        }
    }

    /// A stop sequence appeared.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Takes `text`; returns what may be passed on now.
    pub fn push(&mut self, text: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.held.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            let out = self.held[..at].to_owned();
            self.held.clear();
            return out;
        }
        // Hold back the longest end of the text that begins a stop sequence.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                let held = &self.held;
                (1..s.len().min(held.len() + 1))
                    .rev()
                    .filter(move |&n| held.is_char_boundary(held.len() - n))
                    .find(move |&n| s.starts_with(&held[held.len() - n..]))
            })
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        out
    }

    /// The text ended: what was held back is passed on (unless a sequence stopped it).
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }
}

/// Why a choice ended, in OpenAI's words.
pub fn finish_reason(end: runtime::events::End) -> &'static str {
    use runtime::events::End;
    match end {
        End::Eog | End::Stop => "stop",
        End::Length | End::Context => "length",
        // (a cancelled generation's client is gone; nothing reads this)
        End::Cancelled => "cancelled",
    }
}

/// `usage`.
pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// What the responses of one request share: its id, creation time and model name.
#[derive(Debug, Clone)]
pub struct Stamp {
    pub id: String,
    pub created: u64,
    pub model: String,
    /// A chat completion (else a text completion).
    pub chat: bool,
}

impl Stamp {
    fn object(&self, kind: &str, choices: Value) -> Map<String, Value> {
        let mut o = Map::new();
        o.insert("id".into(), json!(self.id));
        o.insert("object".into(), json!(kind));
        o.insert("created".into(), json!(self.created));
        o.insert("model".into(), json!(self.model));
        o.insert("choices".into(), choices);
        o
    }

    /// A stream chunk carrying new text (and the role, on the first).
    pub fn chunk(&self, content: &str, reasoning: &str, first: bool, reset: bool) -> String {
        let o = if self.chat {
            let mut delta = Map::new();
            if first {
                delta.insert("role".into(), json!("assistant"));
            }
            if !content.is_empty() || first || reset {
                delta.insert("content".into(), json!(content));
            }
            if !reasoning.is_empty() || reset {
                delta.insert("reasoning_content".into(), json!(reasoning));
            }
            let mut o = self.object(
                "chat.completion.chunk",
                json!([{"index": 0, "delta": delta, "finish_reason": null}]),
            );
            if reset {
                // The delta is the whole text so far, replacing what was sent.
                o.insert("sluice".into(), json!({"reset": true}));
            }
            o
        } else {
            self.object(
                "text_completion",
                json!([{"index": 0, "text": content, "finish_reason": null}]),
            )
        };
        Value::Object(o).to_string()
    }

    /// The chunk that ends the choice.
    pub fn last_chunk(&self, finish: &str) -> String {
        let choice = if self.chat {
            json!([{"index": 0, "delta": {}, "finish_reason": finish}])
        } else {
            json!([{"index": 0, "text": "", "finish_reason": finish}])
        };
        let kind = if self.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        Value::Object(self.object(kind, choice)).to_string()
    }

    /// The usage chunk (`stream_options.include_usage`): no choices.
    pub fn usage_chunk(&self, usage: Value) -> String {
        let kind = if self.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let mut o = self.object(kind, json!([]));
        o.insert("usage".into(), usage);
        Value::Object(o).to_string()
    }

    /// The whole response.
    pub fn response(
        &self,
        content: &str,
        reasoning: &str,
        finish: &str,
        usage: Value,
        timings: Value,
    ) -> String {
        let mut o = if self.chat {
            let mut message = Map::new();
            message.insert("role".into(), json!("assistant"));
            message.insert("content".into(), json!(content));
            if !reasoning.is_empty() {
                message.insert("reasoning_content".into(), json!(reasoning));
            }
            self.object(
                "chat.completion",
                json!([{"index": 0, "message": message, "finish_reason": finish}]),
            )
        } else {
            self.object(
                "text_completion",
                json!([{"index": 0, "text": content, "finish_reason": finish}]),
            )
        };
        o.insert("usage".into(), usage);
        o.insert("sluice".into(), timings);
        Value::Object(o).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtime::refusal::{ConfigError, Part, Problem, Refusal, Setting};

    #[test]
    fn a_refusal_is_classified_by_its_variant_not_its_text() {
        let full = Refusal::ContextFull {
            tokens: 40,
            n_ctx: 32,
            problem: Problem(vec![
                Part::Text("the prompt is 40 tokens and the context holds 32 (".into()),
                Part::Setting(Setting::Context),
                Part::Text("): no room to generate".into()),
            ]),
        };
        let e = refusal_error(&full);
        assert_eq!((e.status, e.code), (400, Some("context_length_exceeded")));
        assert_eq!(
            e.message,
            "the prompt is 40 tokens and the context holds 32 (set by the server): no room to generate"
        );
        // a text that speaks of the context is not enough
        let other = Refusal::Request("the chat template needs a context".into());
        let e = refusal_error(&other);
        assert_eq!((e.status, e.code), (400, None));
        let e = refusal_error(&Refusal::EmptyPrompt);
        assert_eq!((e.status, e.code), (400, None));
    }

    #[test]
    fn a_setting_refusal_names_the_requests_field_or_the_servers_setting() {
        let seed = Refusal::Setting(ConfigError {
            setting: Setting::Seed,
            problem: Problem(vec![
                Part::Setting(Setting::Seed),
                Part::Text(" 5000000000 is too large".into()),
            ]),
        });
        let e = refusal_error(&seed);
        assert_eq!((e.status, e.code), (400, None));
        assert_eq!(e.message, "seed 5000000000 is too large");
        let cache = Refusal::Setting(ConfigError {
            setting: Setting::CacheMb,
            problem: Problem(vec![
                Part::Setting(Setting::CacheMb),
                Part::Text(" 9 is too large".into()),
            ]),
        });
        assert_eq!(
            refusal_error(&cache).message,
            "stream.cache_mb 9 is too large"
        );
        assert!(!refusal_error(&cache).message.contains("--"));
    }

    #[test]
    fn chat_requests_parse_with_their_options() {
        let p = parse_chat(
            br#"{"model":"x","messages":[{"role":"developer","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"he"},{"type":"text","text":"llo"}]},
                {"role":"assistant","content":null}],
                "max_tokens":5,"max_completion_tokens":7,"temperature":0,"top_p":0.5,"top_k":3,
                "min_p":0.1,"seed":-1,"stop":"\n","stream":true,
                "stream_options":{"include_usage":true},
                "chat_template_kwargs":{"enable_thinking":false},"logprobs":null}"#,
        )
        .unwrap();
        assert_eq!(
            p.messages,
            vec![
                ("system", "be brief".to_owned()),
                ("user", "hello".to_owned()),
                ("assistant", String::new())
            ]
        );
        assert_eq!(p.think, Some(false));
        let c = p.common;
        assert_eq!(c.max_tokens, Some(7));
        assert_eq!(c.sampling.temperature, Some(0.0));
        assert_eq!(c.sampling.top_k, Some(3));
        assert_eq!(c.sampling.seed, Some(u32::MAX));
        assert_eq!(c.stop, vec!["\n".to_owned()]);
        assert!(c.stream && c.include_usage);
    }

    #[test]
    fn bad_chat_requests_say_what_is_wrong() {
        let msg = |b: &str| parse_chat(b.as_bytes()).unwrap_err().message;
        assert!(msg("[1]").contains("JSON object"));
        assert!(msg("{").contains("not valid JSON"));
        assert!(msg(r#"{"messages":[]}"#).contains("empty"));
        assert!(msg(r#"{"messages":"hi"}"#).contains("array"));
        assert!(msg(r#"{"messages":[{"role":"tool","content":"x"}]}"#).contains("\"tool\""));
        assert!(msg(r#"{"messages":[{"content":"x"}]}"#).contains("no \"role\""));
        let m = r#"[{"role":"user","content":"x"}]"#;
        assert!(msg(&format!(r#"{{"messages":{m},"temperature":"hot"}}"#)).contains("temperature"));
        assert!(msg(&format!(r#"{{"messages":{m},"max_tokens":0}}"#)).contains("max_tokens"));
        assert!(msg(&format!(r#"{{"messages":{m},"n":2}}"#)).contains("\"n\""));
        assert!(
            msg(&format!(
                r#"{{"messages":{m},"stop":["a","b","c","d","e"]}}"#
            ))
            .contains("4")
        );
        assert!(msg(&format!(r#"{{"messages":{m},"top_p":2}}"#)).contains("top_p"));
        let image = msg(r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#);
        assert!(
            image.contains("image_url") && image.contains("images are not supported"),
            "{image}"
        );
        assert!(
            msg(r#"{"messages":[{"role":"user","content":[{"type":"input_audio"}]}]}"#)
                .contains("\"input_audio\" are not supported")
        );
        assert_eq!(parse_chat(b"{}").unwrap_err().status, 400);
    }

    #[test]
    fn completion_requests_parse() {
        let p = parse_completion(br#"{"prompt":["once"],"max_tokens":3}"#).unwrap();
        assert_eq!(p.prompt, "once");
        assert_eq!(p.common.max_tokens, Some(3));
        assert!(parse_completion(br#"{"prompt":["a","b"]}"#).is_err());
        assert!(parse_completion(br#"{"max_tokens":3}"#).is_err());
    }

    #[test]
    fn stop_sequences_hold_back_and_cut() {
        let mut m = StopMatcher::new(vec!["END".into(), "\n\n".into()]);
        assert_eq!(m.push("hello E"), "hello ");
        assert_eq!(m.push("N"), "");
        assert_eq!(m.push("vy\n"), "ENvy");
        assert_eq!(m.push("\nrest"), "");
        assert!(m.stopped());
        assert_eq!(m.push("more"), "");
        assert_eq!(m.finish(), "");
        let mut m = StopMatcher::new(vec!["ab".into()]);
        assert_eq!(m.push("xa"), "x");
        assert_eq!(m.finish(), "a");
        // Multi-byte text is cut on character boundaries only.
        let mut m = StopMatcher::new(vec!["é!".into()]);
        assert_eq!(m.push("café"), "caf");
        assert_eq!(m.push("!"), "");
        assert!(m.stopped());
        let mut m = StopMatcher::new(Vec::new());
        assert_eq!(m.push("any"), "any");
    }

    #[test]
    fn reasoning_travels_apart_from_the_answer() {
        let stamp = Stamp {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
            chat: true,
        };
        let first: Value = serde_json::from_str(&stamp.chunk("", "", true, false)).unwrap();
        assert_eq!(
            first["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        let think: Value = serde_json::from_str(&stamp.chunk("", "hmm", false, false)).unwrap();
        assert_eq!(
            think["choices"][0]["delta"],
            json!({"reasoning_content": "hmm"})
        );
        assert!(think.get("sluice").is_none());
        let reset: Value = serde_json::from_str(&stamp.chunk("a", "b", false, true)).unwrap();
        assert_eq!(
            reset["choices"][0]["delta"],
            json!({"content": "a", "reasoning_content": "b"})
        );
        assert_eq!(reset["sluice"]["reset"], true);
        let whole: Value = serde_json::from_str(&stamp.response(
            "Paris.",
            "The user asks...",
            "stop",
            usage(3, 2),
            json!({}),
        ))
        .unwrap();
        let m = &whole["choices"][0]["message"];
        assert_eq!(
            (m["content"].as_str(), m["reasoning_content"].as_str()),
            (Some("Paris."), Some("The user asks..."))
        );
        assert_eq!(whole["usage"]["total_tokens"], 5);
        let plain: Value =
            serde_json::from_str(&stamp.response("x", "", "length", usage(1, 1), json!({})))
                .unwrap();
        assert!(
            plain["choices"][0]["message"]
                .get("reasoning_content")
                .is_none()
        );
        let last: Value = serde_json::from_str(&stamp.last_chunk("stop")).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        let u: Value = serde_json::from_str(&stamp.usage_chunk(usage(3, 2))).unwrap();
        assert_eq!(u["choices"], json!([]));
    }

    #[test]
    fn errors_have_openai_shape() {
        let e = ApiError::new(401, "no key");
        let v: Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(v["error"]["type"], "authentication_error");
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert_eq!(v["error"]["message"], "no key");
        let v: Value = serde_json::from_str(&ApiError::bad("x").body()).unwrap();
        assert!(v["error"]["code"].is_null());
    }
}
