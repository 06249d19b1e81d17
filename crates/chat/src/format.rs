//! What a model's own template says about its reasoning: how the span is delimited, and how a
//! `think:false` request is honoured (`think_ctl`). Everything here is read off renderings of
//! the template over a fixed probe conversation — never off the model's name.

use crate::ChatError;
use crate::reasoning::ReasoningSplitter;
use crate::template::{ChatTemplate, Data, RenderRequest};

/// How a `think:false` request can be honoured (`BMOE_READY.think_ctl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkCtl {
    /// Passing `enable_thinking=false` is all there is to do: the template reads it, or the
    /// model does not reason.
    Template,
    /// The template ignores the flag, but reasoning is a structural section (a channel) that
    /// the prompt can start past.
    Prefill,
    /// The model reasons in a span of its own on every turn and cannot be asked not to.
    None,
}

impl std::fmt::Display for ThinkCtl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ThinkCtl {
    /// The protocol spelling: `template`, `prefill` or `none`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ThinkCtl::Template => "template",
            ThinkCtl::Prefill => "prefill",
            ThinkCtl::None => "none",
        }
    }
}

/// How reasoning is delimited in the model's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReasoningSyntax {
    /// No reasoning span: everything is answer.
    None,
    /// An inline span between two tags (`<think>`/`</think>`, `<|channel>thought`/`<channel|>`).
    Tags { open: String, close: String },
    /// Harmony messages: `analysis` channel bodies are reasoning.
    Harmony,
}

/// A rendered prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The whole prompt text.
    pub text: String,
    /// Its tail after the last turn (the assistant header, and whatever the template or the
    /// think control put after it): where the model's output starts.
    pub generation_prompt: String,
}

/// A chat template together with what its renderings tell about reasoning.
#[derive(Debug)]
pub struct ChatFormat {
    template: ChatTemplate,
    think_ctl: ThinkCtl,
    syntax: ReasoningSyntax,
    /// For a section format: the text the template renders from the assistant header to the
    /// answer when the reasoning is empty (it opens and closes the reasoning section, then opens
    /// the answer).
    prefill: Option<String>,
}

const PROBE_USER: &str = "Probe question 4d1c";
const PROBE_REASONING: &str = "ProbeReasoning7f3a";
const PROBE_ANSWER: &str = "ProbeAnswer9b2e";

fn message(role: &str, content: &str) -> Data {
    Data::object([
        ("role", Data::string(role)),
        ("content", Data::string(content)),
    ])
}

fn probe_user() -> Vec<Data> {
    vec![message("user", PROBE_USER)]
}

fn probe_assistant(reasoning: bool) -> Data {
    let mut members = vec![("role", Data::string("assistant"))];
    if reasoning {
        members.push(("reasoning_content", Data::string(PROBE_REASONING)));
    }
    members.push(("content", Data::string(PROBE_ANSWER)));
    Data::object(members)
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    let mut n = 0;
    for (x, y) in a.char_indices().zip(b.chars()) {
        if x.1 != y {
            break;
        }
        n = x.0 + x.1.len_utf8();
    }
    n
}

/// Moves a split position back to the start of the `<...>` token it falls inside, if any.
fn align_to_tag(text: &str, pos: usize) -> usize {
    let head = &text[..pos];
    match (head.rfind('<'), head.rfind('>')) {
        (Some(lt), Some(gt)) if lt > gt => lt,
        (Some(lt), None) => lt,
        _ => pos,
    }
}

/// `<name></name>` (one token each side, nothing between) split into its two tags.
fn empty_tag_pair(s: &str) -> Option<(String, String)> {
    let s = s.trim();
    let mut parts = s.split_whitespace();
    if let (Some(a), Some(b), None) = (parts.next(), parts.next(), parts.next()) {
        return Some((a.to_owned(), b.to_owned()));
    }
    let i = s.find("</")?;
    let (open, close) = s.split_at(i);
    let name = open.strip_prefix('<')?.strip_suffix('>')?;
    (!name.is_empty() && close == format!("</{name}>")).then(|| (open.to_owned(), close.to_owned()))
}

/// The opening tag `text` ends with, `<name>`, when `source` also contains `</name>`.
fn trailing_open_tag(text: &str, source: &str) -> Option<(String, String)> {
    let g = text.trim_end();
    let start = g.rfind('<')?;
    let tag = &g[start..];
    let name = tag.strip_prefix('<')?.strip_suffix('>')?;
    if name.is_empty()
        || name.starts_with('/')
        || name.contains(|c: char| c.is_whitespace() || c == '<')
    {
        return None;
    }
    let close = format!("</{name}>");
    source.contains(&close).then(|| (tag.to_owned(), close))
}

/// An empty `<name></name>` pair anywhere in `text`.
fn find_empty_pair(text: &str) -> Option<(String, String)> {
    let mut from = 0;
    while let Some(rel) = text[from..].find("></") {
        let mid = from + rel + 1;
        if let Some(start) = text[..mid].rfind('<') {
            let open = &text[start..mid];
            let name = &open[1..open.len() - 1];
            let close = format!("</{name}>");
            if !name.is_empty() && !name.starts_with('/') && text[mid..].starts_with(&close) {
                return Some((open.to_owned(), close));
            }
        }
        from = mid;
    }
    None
}

/// A tag-pair syntax; no syntax at all when a tag would be empty.
fn tags(open: &str, close: &str) -> ReasoningSyntax {
    if open.is_empty() || close.is_empty() {
        return ReasoningSyntax::None;
    }
    ReasoningSyntax::Tags {
        open: open.to_owned(),
        close: close.to_owned(),
    }
}

/// How the template renders an assistant turn that carries reasoning.
enum Rendered {
    /// Reasoning inline between `open` and `close` inside the answer's message.
    Span { open: String, close: String },
    /// Reasoning in a section of its own; the answer opens a new section with the assistant
    /// header. `open` runs from the header to the reasoning, `close` from it to the answer.
    Section {
        open: String,
        close: String,
        harmony: bool,
    },
    /// The reasoning is not rendered (or not as a delimited span).
    Absent,
}

/// The renderings the decision is read from.
struct Probe {
    /// Rendering with thinking on and off differs.
    reads_flag: bool,
    /// The generation prompt with thinking on / off.
    gen_on: String,
    gen_off: String,
    /// The assistant turn with reasoning, and without, as rendered after the user turn.
    turn_reasoned: String,
    turn_plain: Option<String>,
}

impl ChatFormat {
    /// Probes `template` (a handful of renderings of a fixed conversation) and keeps it.
    pub fn new(template: ChatTemplate) -> ChatFormat {
        let (think_ctl, syntax, prefill) = Self::decide(&template);
        ChatFormat {
            template,
            think_ctl,
            syntax,
            prefill,
        }
    }

    /// The template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// How `think:false` is honoured.
    pub fn think_ctl(&self) -> ThinkCtl {
        self.think_ctl
    }

    /// How reasoning is delimited in the output.
    pub fn reasoning_syntax(&self) -> &ReasoningSyntax {
        &self.syntax
    }

    fn render_probe(
        t: &ChatTemplate,
        messages: &[Data],
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Option<String> {
        let messages = Data::array(messages.iter().cloned());
        let mut req = RenderRequest::new(&messages);
        req.add_generation_prompt = add_generation_prompt;
        req.enable_thinking = enable_thinking;
        t.render(&req).ok()
    }

    fn run_probe(t: &ChatTemplate) -> Option<Probe> {
        let user = probe_user();
        let mut history = user.clone();
        history.push(probe_assistant(true));
        history.push(message("user", PROBE_USER));
        let reads_flag = [&user, &history].iter().any(|msgs| {
            let on = Self::render_probe(t, msgs, true, Some(true));
            let off = Self::render_probe(t, msgs, true, Some(false));
            on.is_some() && off.is_some() && on != off
        });
        let base = Self::render_probe(t, &user, false, Some(true))?;
        let after_base = |full: String| full[common_prefix_len(&base, &full)..].to_owned();
        let gen_on = after_base(Self::render_probe(t, &user, true, Some(true))?);
        let base_off = Self::render_probe(t, &user, false, Some(false))?;
        let full_off = Self::render_probe(t, &user, true, Some(false))?;
        let gen_off = full_off[common_prefix_len(&base_off, &full_off)..].to_owned();
        let turn = |reasoning: bool| {
            let mut msgs = user.clone();
            msgs.push(probe_assistant(reasoning));
            Self::render_probe(t, &msgs, false, Some(true)).map(&after_base)
        };
        Some(Probe {
            reads_flag,
            gen_on,
            gen_off,
            turn_reasoned: turn(true)?,
            turn_plain: turn(false),
        })
    }

    /// The decision of `think_ctl` and the reasoning syntax, from the probe renderings.
    fn decide(t: &ChatTemplate) -> (ThinkCtl, ReasoningSyntax, Option<String>) {
        let Some(p) = Self::run_probe(t) else {
            // The probe conversation is rejected: nothing is known, and passing the flag is
            // the only thing left to do.
            return (ThinkCtl::Template, ReasoningSyntax::None, None);
        };
        let flag_or = |ctl| {
            if p.reads_flag {
                ThinkCtl::Template
            } else {
                ctl
            }
        };
        match Self::classify_turn(&p) {
            Rendered::Span { open, close } => (flag_or(ThinkCtl::None), tags(&open, &close), None),
            Rendered::Section {
                open,
                close,
                harmony,
            } => {
                let to_answer = format!("{open}{close}");
                let syntax = if harmony {
                    ReasoningSyntax::Harmony
                } else {
                    let head = p.gen_on.trim();
                    let mut opener = open.strip_prefix(head).unwrap_or(&open).trim();
                    if opener.is_empty() {
                        opener = open.trim();
                    }
                    tags(opener, close.trim())
                };
                (flag_or(ThinkCtl::Prefill), syntax, Some(to_answer))
            }
            Rendered::Absent => {
                // No reasoning rendered from the message, but the template may still use a
                // span: one its generation prompt opens, or an empty pair it writes.
                let owned = trailing_open_tag(&p.gen_on, t.source())
                    .or_else(|| find_empty_pair(&p.turn_reasoned))
                    .or_else(|| p.turn_plain.as_deref().and_then(find_empty_pair));
                // An empty span the thinking-off prompt adds (Gemma 4's `<|channel>thought`).
                let off_pair = || {
                    let extra = &p.gen_off[common_prefix_len(&p.gen_on, &p.gen_off)..];
                    empty_tag_pair(extra)
                };
                match owned {
                    Some((open, close)) => (
                        flag_or(ThinkCtl::None),
                        ReasoningSyntax::Tags { open, close },
                        None,
                    ),
                    None => match off_pair() {
                        Some((open, close)) if p.reads_flag => (
                            ThinkCtl::Template,
                            ReasoningSyntax::Tags { open, close },
                            None,
                        ),
                        _ => (ThinkCtl::Template, ReasoningSyntax::None, None),
                    },
                }
            }
        }
    }

    /// Reads the structure of the rendered assistant turn with reasoning against the
    /// generation prompt.
    fn classify_turn(p: &Probe) -> Rendered {
        let turn = &p.turn_reasoned;
        let header = &p.gen_on;
        let Some(r) = turn.find(PROBE_REASONING) else {
            return Rendered::Absent;
        };
        let after = &turn[r + PROBE_REASONING.len()..];
        let Some(a) = after.find(PROBE_ANSWER) else {
            return Rendered::Absent;
        };
        let before = &turn[..r];
        let between = &after[..a];
        let head = header.trim();
        if !head.is_empty() && between.contains(head) {
            // The answer is a new message: a section of its own. From the assistant header on,
            // the text up to the reasoning and from the reasoning to the answer.
            let from_header = match before.find(head) {
                Some(h) => &before[h..],
                None => before,
            };
            let harmony = from_header.contains("<|channel|>") && between.contains("<|message|>");
            return Rendered::Section {
                open: from_header.to_owned(),
                close: between.to_owned(),
                harmony,
            };
        }
        let close = between.trim();
        if close.is_empty() {
            return Rendered::Absent;
        }
        // The opener: what follows the generation prompt; when the generation prompt itself
        // opens the span, what the turn without reasoning does not have; failing that, a
        // `<name>` matching a `</name>` closer; failing that, the whole turn head.
        let mut open = "";
        if before.starts_with(header.as_str()) {
            open = before[header.len()..].trim();
        }
        if open.is_empty()
            && let Some(plain) = &p.turn_plain
        {
            let cut = align_to_tag(before, common_prefix_len(before, plain));
            open = before[cut..].trim();
        }
        let tag_open;
        if open.is_empty()
            && let Some(name) = close.strip_prefix("</").and_then(|c| c.strip_suffix('>'))
        {
            tag_open = format!("<{name}>");
            if before.trim_end().ends_with(&tag_open) {
                open = &tag_open;
            }
        }
        if open.is_empty() {
            open = before.trim();
        }
        if open.is_empty() {
            return Rendered::Absent;
        }
        Rendered::Span {
            open: open.to_owned(),
            close: close.to_owned(),
        }
    }

    /// Renders a prompt for a generation (`add_generation_prompt` on). `think` false asks for
    /// no reasoning in the way [`ThinkCtl`] says; with `None` the flag is passed and the model
    /// reasons anyway.
    pub fn render_prompt(
        &self,
        messages: &Data,
        tools: Option<&Data>,
        think: bool,
        extra: &[(String, Data)],
    ) -> Result<Prompt, ChatError> {
        let mut req = RenderRequest::new(messages);
        req.tools = tools;
        req.enable_thinking = Some(think);
        req.extra = extra.to_vec();
        // Without the generation prompt, to find where it starts. A template that refuses that
        // rendering (a conversation it only accepts with a generation prompt) gives no tail.
        let without = self.template.render(&req);
        req.add_generation_prompt = true;
        let mut text = self.template.render(&req)?;
        let mut generation_prompt = match &without {
            Ok(w) => text[common_prefix_len(w, &text)..].to_owned(),
            Err(_) => String::new(),
        };
        if !think
            && self.think_ctl == ThinkCtl::Prefill
            && let Some(to_answer) = &self.prefill
        {
            // Start the turn past the reasoning section: what the template renders from the
            // assistant header to the answer, with the reasoning empty.
            let without = without?;
            match to_answer.strip_prefix(generation_prompt.as_str()) {
                Some(rest) if !generation_prompt.is_empty() => {
                    text.push_str(rest);
                    generation_prompt.push_str(rest);
                }
                _ => {
                    text = without;
                    text.push_str(to_answer);
                    generation_prompt = to_answer.clone();
                }
            }
        }
        Ok(Prompt {
            text,
            generation_prompt,
        })
    }

    /// A splitter for the output that follows `prompt`.
    pub fn splitter(&self, prompt: &Prompt) -> ReasoningSplitter {
        ReasoningSplitter::new(&self.syntax, &prompt.generation_prompt)
    }
}
