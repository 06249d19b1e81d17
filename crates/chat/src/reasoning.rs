//! Streaming split of generated text into the answer and the reasoning span.

use crate::format::ReasoningSyntax;

/// What one [`ReasoningSplitter::push`] adds.
///
/// Without `reset` the two strings extend what earlier deltas delivered; with `reset` they are
/// full snapshots that replace it (a closing tag arrived and text already delivered as answer
/// turned out to be reasoning).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SplitDelta {
    /// New answer text (the whole answer so far when `reset`).
    pub text: String,
    /// New reasoning text (the whole reasoning so far when `reset`).
    pub reasoning: String,
    /// The strings are snapshots, not extensions.
    pub reset: bool,
}

impl SplitDelta {
    /// Applies this delta to accumulated `(answer, reasoning)` as a consumer of the telemetry
    /// lines does.
    pub fn apply(&self, answer: &mut String, reasoning: &mut String) {
        if self.reset {
            answer.clear();
            reasoning.clear();
        }
        answer.push_str(&self.text);
        reasoning.push_str(&self.reasoning);
    }
}

/// The part of a tag-pair splitter that decides where text goes.
#[derive(Debug, Clone)]
struct TagState {
    open: String,
    close: String,
    in_span: bool,
    /// An opening or closing tag was seen in the generated text.
    tag_seen: bool,
    /// Whitespace right after a closing tag is not part of the answer.
    skip_answer_ws: bool,
}

/// The part of a harmony (channel) splitter that decides where text goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Harmony {
    /// Between messages: stray text is answer.
    Idle,
    /// In a message header (`<|start|>role ... <|channel|>name ...`), `channel` collects the
    /// text after `<|channel|>`.
    Header { channel: Option<String> },
    /// In a message body.
    Body { reasoning: bool },
}

const HARMONY_MARKERS: [&str; 7] = [
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|constrain|>",
];

#[derive(Debug, Clone)]
enum Mode {
    Plain,
    Tags(TagState),
    Harmony(Harmony),
}

/// Splits a generation's text, fed as it streams, into answer and reasoning.
///
/// Tag formats (`<think>…</think>`, Gemma's `<|channel>thought…<channel|>`, ...): the span body
/// is reasoning (leading and trailing whitespace removed), the rest is answer (whitespace right
/// after a closing tag removed). A closing tag with no opening one before it — the prompt did
/// not open the span and the model reasoned without the opening tag — turns everything
/// delivered as answer so far into reasoning: that push carries `reset`. When the prompt itself
/// opened the span, the output starts inside it.
///
/// Harmony (gpt-oss): bodies of `analysis` messages are reasoning, bodies of other channels
/// are answer, headers and markers are neither.
///
/// A tag split across pushes is held back until it is complete or cannot be one; [`finish`]
/// releases what is held. The deltas, applied in order, always equal [`answer`]/[`reasoning`].
///
/// [`finish`]: ReasoningSplitter::finish
/// [`answer`]: ReasoningSplitter::answer
/// [`reasoning`]: ReasoningSplitter::reasoning
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    mode: Mode,
    /// Unprocessed text: a possible partial tag at the end of what was pushed.
    pending: String,
    answer: String,
    reasoning: String,
    /// Whitespace at the end of the reasoning, held until more reasoning follows.
    reasoning_ws: String,
    finished: bool,
}

impl ReasoningSplitter {
    /// A splitter for `syntax`, positioned after `generation_prompt` (the text the prompt ends
    /// with after the last turn: it may already open the span or select a channel).
    pub fn new(syntax: &ReasoningSyntax, generation_prompt: &str) -> ReasoningSplitter {
        let mode = match syntax {
            ReasoningSyntax::None => Mode::Plain,
            ReasoningSyntax::Tags { open, close } => {
                let find = |tag: &str| {
                    if tag.is_empty() {
                        None
                    } else {
                        generation_prompt.rfind(tag)
                    }
                };
                let in_span = match (find(open), find(close)) {
                    (Some(o), Some(c)) => o > c,
                    (Some(_), None) => true,
                    _ => false,
                };
                Mode::Tags(TagState {
                    open: open.clone(),
                    close: close.clone(),
                    in_span,
                    tag_seen: false,
                    skip_answer_ws: false,
                })
            }
            ReasoningSyntax::Harmony => {
                let mut s = ReasoningSplitter {
                    mode: Mode::Harmony(Harmony::Idle),
                    pending: String::new(),
                    answer: String::new(),
                    reasoning: String::new(),
                    reasoning_ws: String::new(),
                    finished: false,
                };
                // Walk the prompt's last message head to know where the output starts.
                if let Some(pos) = generation_prompt.rfind("<|start|>") {
                    s.push(&generation_prompt[pos..]);
                    s.answer.clear();
                    s.reasoning.clear();
                    s.reasoning_ws.clear();
                }
                return s;
            }
        };
        ReasoningSplitter {
            mode,
            pending: String::new(),
            answer: String::new(),
            reasoning: String::new(),
            reasoning_ws: String::new(),
            finished: false,
        }
    }

    /// The answer so far.
    pub fn answer(&self) -> &str {
        &self.answer
    }

    /// The reasoning so far (trailing whitespace held back until more reasoning follows).
    pub fn reasoning(&self) -> &str {
        &self.reasoning
    }

    /// Feeds newly generated text.
    pub fn push(&mut self, delta: &str) -> SplitDelta {
        let mut out = SplitDelta::default();
        if self.finished {
            return out;
        }
        self.pending.push_str(delta);
        let text = std::mem::take(&mut self.pending);
        let mut rest = text.as_str();
        loop {
            let markers = self.markers();
            // Where a marker may be starting that the text does not complete yet.
            let partial = earliest_partial(rest, &markers);
            match find_first(rest, &markers) {
                Some((pos, idx)) if partial.is_none_or(|q| pos < q) => {
                    self.emit_text(&rest[..pos], &mut out);
                    let marker = markers[idx].clone();
                    rest = &rest[pos + marker.len()..];
                    self.on_marker(&marker, &mut out);
                }
                _ => {
                    // Hold back from the possible start: more text decides.
                    let q = partial.unwrap_or(rest.len());
                    self.emit_text(&rest[..q], &mut out);
                    self.pending = rest[q..].to_owned();
                    break;
                }
            }
        }
        out
    }

    /// Ends the generation: releases held-back text (an incomplete tag is plain text) and
    /// drops the reasoning's trailing whitespace.
    pub fn finish(&mut self) -> SplitDelta {
        let mut out = SplitDelta::default();
        if self.finished {
            return out;
        }
        // What is held may still hold complete markers (one a longer marker could have
        // extended): process it with nothing held back.
        let text = std::mem::take(&mut self.pending);
        let mut rest = text.as_str();
        loop {
            let markers = self.markers();
            match find_first(rest, &markers) {
                Some((pos, idx)) => {
                    self.emit_text(&rest[..pos], &mut out);
                    let marker = markers[idx].clone();
                    rest = &rest[pos + marker.len()..];
                    self.on_marker(&marker, &mut out);
                }
                None => {
                    self.emit_text(rest, &mut out);
                    break;
                }
            }
        }
        self.reasoning_ws.clear();
        self.finished = true;
        out
    }

    /// Splits a whole text at once: `(answer, reasoning)`.
    pub fn split_all(
        syntax: &ReasoningSyntax,
        generation_prompt: &str,
        text: &str,
    ) -> (String, String) {
        let mut s = ReasoningSplitter::new(syntax, generation_prompt);
        s.push(text);
        s.finish();
        (s.answer, s.reasoning)
    }

    /// The markers that mean something in the current state (never an empty one).
    fn markers(&self) -> Vec<String> {
        let mut m = self.state_markers();
        m.retain(|s| !s.is_empty());
        m
    }

    fn state_markers(&self) -> Vec<String> {
        match &self.mode {
            Mode::Plain => Vec::new(),
            Mode::Tags(t) => {
                if t.in_span {
                    vec![t.close.clone()]
                } else if t.tag_seen {
                    vec![t.open.clone()]
                } else {
                    vec![t.open.clone(), t.close.clone()]
                }
            }
            Mode::Harmony(_) => HARMONY_MARKERS.iter().map(|m| (*m).to_owned()).collect(),
        }
    }

    fn emit_text(&mut self, text: &str, out: &mut SplitDelta) {
        if text.is_empty() {
            return;
        }
        enum Dest {
            Answer,
            Reasoning,
            Nowhere,
        }
        let dest = match &mut self.mode {
            Mode::Plain => Dest::Answer,
            Mode::Tags(t) => {
                if t.in_span {
                    Dest::Reasoning
                } else {
                    Dest::Answer
                }
            }
            Mode::Harmony(h) => match h {
                Harmony::Idle => Dest::Answer,
                Harmony::Header { channel } => {
                    if let Some(c) = channel {
                        c.push_str(text);
                    }
                    Dest::Nowhere
                }
                Harmony::Body { reasoning: true } => Dest::Reasoning,
                Harmony::Body { reasoning: false } => Dest::Answer,
            },
        };
        match dest {
            Dest::Answer => {
                let mut text = text;
                if let Mode::Tags(t) = &mut self.mode
                    && t.skip_answer_ws
                {
                    text = text.trim_start();
                    if !text.is_empty() {
                        t.skip_answer_ws = false;
                    }
                }
                self.answer.push_str(text);
                out.text.push_str(text);
            }
            Dest::Reasoning => self.add_reasoning(text, out),
            Dest::Nowhere => {}
        }
    }

    fn add_reasoning(&mut self, text: &str, out: &mut SplitDelta) {
        let trims = matches!(self.mode, Mode::Tags(_));
        let mut text = text;
        if trims && self.reasoning.is_empty() {
            text = text.trim_start();
        }
        if text.is_empty() {
            return;
        }
        if !trims {
            self.reasoning.push_str(text);
            out.reasoning.push_str(text);
            return;
        }
        let body = text.trim_end();
        let tail = &text[body.len()..];
        if !body.is_empty() {
            let ws = std::mem::take(&mut self.reasoning_ws);
            self.reasoning.push_str(&ws);
            self.reasoning.push_str(body);
            out.reasoning.push_str(&ws);
            out.reasoning.push_str(body);
        }
        self.reasoning_ws.push_str(tail);
    }

    fn on_marker(&mut self, marker: &str, out: &mut SplitDelta) {
        match &mut self.mode {
            Mode::Plain => {}
            Mode::Tags(t) => {
                if t.in_span {
                    // Closing tag: the span ends, whitespace before the answer is dropped.
                    t.in_span = false;
                    t.tag_seen = true;
                    t.skip_answer_ws = true;
                    self.reasoning_ws.clear();
                } else if marker == t.open {
                    t.in_span = true;
                    t.tag_seen = true;
                } else {
                    // A closing tag nobody opened: what was answer was reasoning.
                    t.tag_seen = true;
                    t.skip_answer_ws = true;
                    let moved = std::mem::take(&mut self.answer);
                    self.reasoning_ws.clear();
                    let mut reasoning = std::mem::take(&mut self.reasoning);
                    reasoning.push_str(&moved);
                    let trimmed = reasoning.trim();
                    self.reasoning = trimmed.to_owned();
                    out.reset = true;
                    out.text = String::new();
                    out.reasoning = self.reasoning.clone();
                }
            }
            Mode::Harmony(h) => {
                *h = match (marker, &*h) {
                    ("<|start|>", _) => Harmony::Header { channel: None },
                    ("<|channel|>", _) => Harmony::Header {
                        channel: Some(String::new()),
                    },
                    ("<|constrain|>", Harmony::Header { channel }) => Harmony::Header {
                        channel: channel.clone(),
                    },
                    ("<|message|>", Harmony::Header { channel }) => {
                        let name = channel.as_deref().unwrap_or("");
                        let name = name.split_whitespace().next().unwrap_or("");
                        Harmony::Body {
                            reasoning: name == "analysis",
                        }
                    }
                    ("<|message|>", _) => Harmony::Body { reasoning: false },
                    ("<|end|>" | "<|return|>" | "<|call|>", _) => Harmony::Idle,
                    (_, other) => other.clone(),
                };
            }
        }
    }
}

/// The earliest occurrence of any marker: `(byte position, marker index)`.
fn find_first(text: &str, markers: &[String]) -> Option<(usize, usize)> {
    markers
        .iter()
        .enumerate()
        .filter_map(|(i, m)| text.find(m.as_str()).map(|p| (p, i)))
        .min_by_key(|&(p, i)| (p, std::cmp::Reverse(markers[i].len())))
}

/// The earliest position from which the rest of `text` is a proper prefix of a marker: a
/// marker that may be starting there and that more text would complete.
fn earliest_partial(text: &str, markers: &[String]) -> Option<usize> {
    let longest = markers.iter().map(String::len).max()?;
    let from = text.len().saturating_sub(longest.saturating_sub(1));
    (from..text.len())
        .filter(|&q| text.is_char_boundary(q))
        .find(|&q| {
            let tail = &text[q..];
            markers
                .iter()
                .any(|m| m.len() > tail.len() && m.starts_with(tail))
        })
}
