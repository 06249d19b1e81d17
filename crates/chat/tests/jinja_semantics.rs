//! Small templates, one Jinja2 behaviour each (tests/fixtures/semantics.json), rendered as
//! transformers renders them (tests/fixtures/semantics_renders.json, made by
//! scripts/gen_template_refs.py): tojson and its options without HTML escaping, how values
//! print, undefined values, whitespace control, loop controls, Python string and dict methods,
//! raise_exception, strftime_now.

mod common;

use chat::{ChatError, ChatTemplate, Clock, Data, RenderRequest};
use serde_json::Value as Json;

/// Behaviours minijinja does not have; no template of the collection uses them. Each must still
/// differ, so the list cannot go stale.
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
    (
        "percent_format",
        "Python's `'%s' % args` string formatting is not an operator minijinja has",
    ),
    (
        "tuples_print",
        "minijinja has no tuples: `(1, 'a')` is a list and prints as one",
    ),
];

#[test]
fn semantics_equal_transformers() {
    let dir = common::fixtures();
    let spec_text = std::fs::read_to_string(dir.join("semantics.json")).unwrap();
    let spec = Data::from_json_str(&spec_text).unwrap();
    let meta: Json = serde_json::from_str(&spec_text).unwrap();
    let now = meta["now_unix"].as_i64().unwrap();
    let refs: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("semantics_renders.json")).unwrap())
            .unwrap();
    let data = spec.get("data").unwrap();
    let extra: Vec<(String, Data)> = ["obj", "words", "text"]
        .iter()
        .map(|k| ((*k).to_owned(), data.get(k).unwrap()))
        .collect();
    let cases = spec.get("cases").unwrap().elements();
    let want_cases = refs["cases"].as_array().unwrap();
    assert_eq!(cases.len(), want_cases.len());
    let mut failures = Vec::new();
    for (case, want) in cases.iter().zip(want_cases) {
        let name = case.get("name").unwrap().as_str().unwrap().to_owned();
        assert_eq!(want["name"].as_str(), Some(name.as_str()));
        let source = case.get("template").unwrap().as_str().unwrap().to_owned();
        let messages = case.get("messages").unwrap_or_else(|| Data::array([]));
        let got = ChatTemplate::new(&source, "", "")
            .and_then(|t| t.with_clock(Clock::Fixed(now)))
            .and_then(|t| {
                let mut req = RenderRequest::new(&messages);
                req.extra = extra.clone();
                t.render(&req)
            });
        let known = KNOWN_DIFFERENCES.iter().any(|(n, _)| *n == name);
        match (&want["output"], &want["error"], &got) {
            (Json::String(w), _, Ok(g)) if w == g && known => {
                failures.push(format!("{name}: listed as a known difference but matches"))
            }
            (_, Json::String(_), Err(_)) if known => {
                failures.push(format!("{name}: listed as a known difference but matches"))
            }
            _ if known => {}
            (Json::String(w), _, Ok(g)) if w == g => {}
            (_, Json::String(_), Err(_)) => {}
            _ => failures.push(format!("{name}: transformers {want}\n    ours {got:?}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn raised_message_is_the_templates_own() {
    // The message is passed through unchanged (transformers reports it the same way).
    let t = ChatTemplate::new("{{ raise_exception('Bad <input> & more') }}", "", "").unwrap();
    let msgs = Data::array([]);
    assert_eq!(
        t.render(&RenderRequest::new(&msgs)),
        Err(ChatError::Raised("Bad <input> & more".into()))
    );
}

#[test]
fn syntax_errors_are_reported_at_construction() {
    let err = ChatTemplate::new("{% for x in %}", "", "").unwrap_err();
    assert!(matches!(err, ChatError::Syntax(_)), "{err:?}");
}
