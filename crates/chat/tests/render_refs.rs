//! Every reference rendering under tests/fixtures/renders (made by transformers' own renderer,
//! see tests/fixtures/README.md) is reproduced byte for byte, and every conversation the
//! reference rejected is rejected here too.

mod common;

use chat::{ChatError, ChatTemplate, Clock, Data, RenderRequest};
use serde_json::Value as Json;

fn request<'a>(conv: &Data, messages: &'a Data, tools: &'a Data) -> RenderRequest<'a> {
    let mut req = RenderRequest::new(messages);
    req.add_generation_prompt = conv
        .get("add_generation_prompt")
        .and_then(|d| d.as_bool())
        .unwrap();
    req.enable_thinking = conv.get("enable_thinking").and_then(|d| d.as_bool());
    if conv.get("use_tools").and_then(|d| d.as_bool()) == Some(true) {
        req.tools = Some(tools);
    }
    req
}

/// Where minijinja cannot follow Jinja2 and the reference output is therefore not reproduced.
/// Each entry must still differ (the test fails when one starts matching, so the list cannot go
/// stale); none of them involves a template of the acceptance list.
const KNOWN_DIFFERENCES: &[(&str, &[&str], &str)] = &[
    (
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
        NO_TOOLS,
        "iterates `tools` unguarded: Jinja2 raises on None, minijinja iterates nothing",
    ),
    (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
        NO_TOOLS,
        "iterates `tools` unguarded: Jinja2 raises on None, minijinja iterates nothing",
    ),
    (
        "CohereForAI-c4ai-command-r-plus-tool_use",
        NO_TOOLS,
        "iterates `tools` unguarded: Jinja2 raises on None, minijinja iterates nothing",
    ),
    (
        "llama-cpp-deepseek-r1",
        WITH_TOOLS,
        "`tools | map(...) | tojson`: Jinja2's map is a generator json.dumps rejects; ours is a list",
    ),
    (
        "meetkai-functionary-medium-v3.1",
        WITH_TOOLS,
        "`'...'|safe + text`: Jinja2's Markup HTML-escapes the other operand of +",
    ),
];

const NO_TOOLS: &[&str] = &[
    "single_user",
    "system_turns",
    "system_turns_think_on",
    "system_turns_think_off",
    "ends_with_assistant",
    "reasoning_history_think_on",
    "reasoning_history_think_off",
    "special_chars",
];
const WITH_TOOLS: &[&str] = &[
    "tool_call",
    "tool_call_think_off",
    "tool_call_null_content",
    "tools_only",
];

fn known_difference(template: &str, conversation: &str) -> bool {
    KNOWN_DIFFERENCES
        .iter()
        .any(|(t, convs, _)| *t == template && convs.contains(&conversation))
}

#[test]
fn renderings_equal_transformers() {
    let fixtures = common::fixtures();
    let text = std::fs::read_to_string(fixtures.join("conversations.json")).unwrap();
    let spec = Data::from_json_str(&text).unwrap();
    let meta: Json = serde_json::from_str(&text).unwrap();
    let bos = meta["bos_token"].as_str().unwrap();
    let eos = meta["eos_token"].as_str().unwrap();
    let now = meta["now_unix"].as_i64().unwrap();
    let tools = spec.get("tools").unwrap();
    let convs = spec.get("conversations").unwrap().elements();

    let mut refs: Vec<_> = std::fs::read_dir(fixtures.join("renders"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    refs.sort();
    assert!(
        refs.len() >= 16,
        "expected the reference renderings, found {}",
        refs.len()
    );

    let mut failures = Vec::new();
    let mut checked = 0;
    for path in &refs {
        let doc: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let file = doc["template"].as_str().unwrap();
        let name = file.strip_suffix(".jinja").unwrap();
        let bytes = common::template_bytes(name);
        assert_eq!(
            common::sha256_hex(&bytes),
            doc["template_sha256"].as_str().unwrap(),
            "{file}: the fetched template differs from the one the reference was made from"
        );
        let source = String::from_utf8(bytes).unwrap();
        let tmpl = ChatTemplate::new(&source, bos, eos)
            .and_then(|t| t.with_clock(Clock::Fixed(now)))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let cases = doc["cases"].as_array().unwrap();
        assert_eq!(
            cases.len(),
            convs.len(),
            "{file}: one case per conversation"
        );
        for (case, conv) in cases.iter().zip(&convs) {
            let cname = case["conversation"].as_str().unwrap();
            assert_eq!(conv.get("name").unwrap().as_str(), Some(cname));
            let messages = conv.get("messages").unwrap();
            let got = tmpl.render(&request(conv, &messages, &tools));
            checked += 1;
            if known_difference(name, cname) {
                let same = match (&case["output"], &got) {
                    (Json::String(want), Ok(got)) => want == got,
                    (Json::Null, Err(_)) => true,
                    _ => false,
                };
                if same {
                    failures.push(format!(
                        "{name} / {cname}: listed as a known difference but matches"
                    ));
                }
                continue;
            }
            match (&case["output"], &case["error"], got) {
                (Json::String(want), _, Ok(got)) if *want == got => {}
                (Json::String(want), _, Ok(got)) => failures.push(format!(
                    "{name} / {cname}: rendering differs\n--- transformers\n{want}\n--- ours\n{got}\n"
                )),
                (Json::String(_), _, Err(e)) => {
                    failures.push(format!("{name} / {cname}: transformers rendered, we failed: {e}"))
                }
                (_, Json::String(want), Err(e)) => {
                    // A template's own raise_exception must come back with its message.
                    if let Some(msg) = want.strip_prefix("TemplateError: ")
                        && e != ChatError::Raised(msg.to_owned())
                    {
                        failures.push(format!(
                            "{name} / {cname}: transformers raised {msg:?}, we failed with {e}"
                        ));
                    }
                }
                (_, Json::String(want), Ok(_)) => failures.push(format!(
                    "{name} / {cname}: transformers raised ({want}), we rendered"
                )),
                _ => panic!("{file}: malformed case {case}"),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} renderings differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn raise_exception_carries_the_message() {
    // The message text is the reference's: it is the template's own literal.
    let tmpl = ChatTemplate::new(
        "{% if messages|length > 1 %}{{ raise_exception('only one message, please') }}{% endif %}ok",
        "",
        "",
    )
    .unwrap();
    let two =
        Data::from_json_str(r#"[{"role":"user","content":"a"},{"role":"user","content":"b"}]"#)
            .unwrap();
    let one = Data::from_json_str(r#"[{"role":"user","content":"a"}]"#).unwrap();
    assert_eq!(tmpl.render(&RenderRequest::new(&one)).unwrap(), "ok");
    assert_eq!(
        tmpl.render(&RenderRequest::new(&two)),
        Err(ChatError::Raised("only one message, please".into()))
    );
}
