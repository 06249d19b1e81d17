//! think_ctl and the think:false prompt, decided from the templates of llama.cpp's collection
//! (the acceptance models of the spec's BMOE_READY table).

mod common;

use chat::{ChatFormat, ChatTemplate, Clock, Data, ReasoningSyntax, ThinkCtl};

fn format(name: &str) -> ChatFormat {
    let t = ChatTemplate::new(&common::template_source(name), "<s>", "</s>")
        .and_then(|t| t.with_clock(Clock::Fixed(1_768_469_400)))
        .unwrap();
    ChatFormat::new(t)
}

fn conversation() -> Data {
    Data::from_json_str(
        r#"[{"role":"system","content":"Be brief."},
            {"role":"user","content":"Name a prime."},
            {"role":"assistant","content":"7"},
            {"role":"user","content":"Another?"}]"#,
    )
    .unwrap()
}

#[test]
fn think_ctl_of_the_acceptance_models() {
    // The spec's table: Qwen3 and Gemma 4 read the flag; gpt-oss separates reasoning in a
    // channel; LFM2.5 reasons in a span of its own; the non-reasoning LFM2-8B-A1B and
    // LFM2.5-Instruct have nothing to suppress.
    let cases = [
        ("Qwen-Qwen3-0.6B", ThinkCtl::Template),
        ("Qwen3.5-4B", ThinkCtl::Template),
        ("google-gemma-4-31B-it", ThinkCtl::Template),
        ("openai-gpt-oss-120b", ThinkCtl::Prefill),
        ("LFM2.5-8B-A1B", ThinkCtl::None),
        ("LFM2-8B-A1B", ThinkCtl::Template),
        ("LFM2.5-Instruct", ThinkCtl::Template),
    ];
    for (name, want) in cases {
        assert_eq!(format(name).think_ctl(), want, "{name}");
    }
    assert_eq!(ThinkCtl::Prefill.as_str(), "prefill");
}

#[test]
fn think_ctl_of_the_streamed_moe_families() {
    // The templates of the architectures of docs/model.md that llama.cpp's collection has:
    // GLM-4.5/4.6 (glm4moe) and DeepSeek V3.1 read the flag and reason in <think> spans;
    // Kimi K2 Instruct does not reason (nothing to suppress), Kimi K2 Thinking always does.
    let tags = ReasoningSyntax::Tags {
        open: "<think>".into(),
        close: "</think>".into(),
    };
    let cases = [
        ("GLM-4.6", ThinkCtl::Template, tags.clone()),
        ("GLM-4.7-Flash", ThinkCtl::Template, tags.clone()),
        (
            "deepseek-ai-DeepSeek-V3.1",
            ThinkCtl::Template,
            tags.clone(),
        ),
        (
            "moonshotai-Kimi-K2",
            ThinkCtl::Template,
            ReasoningSyntax::None,
        ),
        ("Kimi-K2-Thinking", ThinkCtl::None, tags.clone()),
    ];
    for (name, ctl, syntax) in cases {
        let f = format(name);
        assert_eq!(f.think_ctl(), ctl, "{name}");
        assert_eq!(*f.reasoning_syntax(), syntax, "{name}");
    }
    // GLM's think:false prompt: the user turn marked /nothink and an empty span after the
    // assistant tag, so the output is answer from its first byte.
    let f = format("GLM-4.6");
    let off = f.render_prompt(&conversation(), None, false, &[]).unwrap();
    assert!(off.text.contains("Another?/nothink"), "{:?}", off.text);
    assert!(
        off.text.ends_with("<|assistant|>\n<think></think>"),
        "{:?}",
        off.text
    );
    let mut s = f.splitter(&off);
    s.push("\nEleven.");
    s.finish();
    assert_eq!(s.reasoning(), "");
    assert_eq!(s.answer().trim(), "Eleven.");
    let on = f.render_prompt(&conversation(), None, true, &[]).unwrap();
    let mut s = f.splitter(&on);
    s.push("<think>small primes</think>\nEleven.");
    s.finish();
    assert_eq!(
        (s.answer().trim(), s.reasoning()),
        ("Eleven.", "small primes")
    );
}

#[test]
fn reasoning_syntax_is_read_from_the_template() {
    let tags = |o: &str, c: &str| ReasoningSyntax::Tags {
        open: o.into(),
        close: c.into(),
    };
    assert_eq!(
        *format("Qwen-Qwen3-0.6B").reasoning_syntax(),
        tags("<think>", "</think>")
    );
    assert_eq!(
        *format("LFM2.5-8B-A1B").reasoning_syntax(),
        tags("<think>", "</think>")
    );
    assert_eq!(
        *format("google-gemma-4-31B-it").reasoning_syntax(),
        tags("<|channel>thought", "<channel|>")
    );
    assert_eq!(
        *format("openai-gpt-oss-120b").reasoning_syntax(),
        ReasoningSyntax::Harmony
    );
    assert_eq!(
        *format("LFM2-8B-A1B").reasoning_syntax(),
        ReasoningSyntax::None
    );
    assert_eq!(
        *format("LFM2.5-Instruct").reasoning_syntax(),
        ReasoningSyntax::None
    );
}

#[test]
fn template_models_get_the_flag() {
    let f = format("Qwen-Qwen3-0.6B");
    let msgs = conversation();
    let on = f.render_prompt(&msgs, None, true, &[]).unwrap();
    let off = f.render_prompt(&msgs, None, false, &[]).unwrap();
    // What the template itself renders with enable_thinking true / false.
    for (think, prompt) in [(true, &on), (false, &off)] {
        let mut req = chat::RenderRequest::new(&msgs);
        req.add_generation_prompt = true;
        req.enable_thinking = Some(think);
        assert_eq!(prompt.text, f.template().render(&req).unwrap());
        assert!(prompt.text.ends_with(&prompt.generation_prompt));
    }
    // Thinking off: the template closed the span, the output starts in the answer.
    let mut s = f.splitter(&off);
    s.push("Eleven.");
    s.finish();
    assert_eq!((s.answer(), s.reasoning()), ("Eleven.", ""));
    // Thinking on: the model opens the span itself.
    let mut s = f.splitter(&on);
    s.push("<think>\nsmall primes\n</think>\n\nEleven.");
    s.finish();
    assert_eq!((s.answer(), s.reasoning()), ("Eleven.", "small primes"));
}

#[test]
fn prefill_starts_the_turn_past_the_reasoning_section() {
    let f = format("openai-gpt-oss-120b");
    let msgs = conversation();
    let on = f.render_prompt(&msgs, None, true, &[]).unwrap();
    let off = f.render_prompt(&msgs, None, false, &[]).unwrap();
    // The thinking-off prompt extends the ordinary one.
    let suffix = off
        .text
        .strip_prefix(on.text.as_str())
        .expect("prefill extends the prompt");
    assert!(!suffix.is_empty());
    // llama.cpp's continuation of an assistant turn with empty reasoning (common/parsers/
    // gpt-oss.cpp): the analysis channel opened and ended, the final channel opened.
    assert_eq!(
        off.generation_prompt,
        "<|start|>assistant<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>"
    );
    // And it is what the template renders for such a turn, up to the answer.
    let mut with_turn: Vec<Data> = msgs.elements();
    with_turn.push(
        Data::from_json_str(r#"{"role":"assistant","thinking":"","content":"ANSWER_MARK"}"#)
            .unwrap(),
    );
    let rendered = f
        .template()
        .render(&chat::RenderRequest::new(&Data::array(with_turn)))
        .unwrap();
    let upto = &rendered[..rendered.find("ANSWER_MARK").unwrap()];
    assert!(upto.ends_with(&off.generation_prompt), "{upto:?}");
    // The reasoning span is closed: the output is answer from its first byte.
    let mut s = f.splitter(&off);
    s.push("Eleven.<|return|>");
    s.finish();
    assert_eq!((s.answer(), s.reasoning()), ("Eleven.", ""));
    // With thinking on the output starts with the analysis channel.
    let mut s = f.splitter(&on);
    s.push("<|channel|>analysis<|message|>primes: 11<|end|><|start|>assistant<|channel|>final<|message|>Eleven.<|return|>");
    s.finish();
    assert_eq!((s.answer(), s.reasoning()), ("Eleven.", "primes: 11"));
}

#[test]
fn none_models_keep_the_prompt_and_own_their_span() {
    let f = format("LFM2.5-8B-A1B");
    let msgs = conversation();
    let on = f.render_prompt(&msgs, None, true, &[]).unwrap();
    let off = f.render_prompt(&msgs, None, false, &[]).unwrap();
    // Nothing the template offers changes the prompt.
    assert_eq!(on, off);
    let mut s = f.splitter(&off);
    s.push("<think>hmm</think>Eleven.");
    s.finish();
    assert_eq!((s.answer(), s.reasoning()), ("Eleven.", "hmm"));
}

#[test]
fn generation_prompt_that_opens_the_span_starts_in_reasoning() {
    // Qwen3.5's generation prompt with thinking on ends inside `<think>`.
    let f = format("Qwen3.5-4B");
    let msgs = conversation();
    let on = f.render_prompt(&msgs, None, true, &[]).unwrap();
    let mut s = f.splitter(&on);
    s.push("weighing 11 and 13\n</think>\n\nEleven.");
    s.finish();
    assert_eq!(
        (s.answer(), s.reasoning()),
        ("Eleven.", "weighing 11 and 13")
    );
    let off = f.render_prompt(&msgs, None, false, &[]).unwrap();
    let mut s = f.splitter(&off);
    s.push("Eleven.");
    s.finish();
    assert_eq!((s.answer(), s.reasoning()), ("Eleven.", ""));
}

#[test]
fn missing_template_is_a_clear_error() {
    let err = chat::select_template(None, &[], None).unwrap_err();
    assert_eq!(err, chat::ChatError::NoTemplate);
    assert!(err.to_string().contains("has no chat template"), "{err}");
    let named = [("tool_use", "{{ 1 }}"), ("rag", "{{ 2 }}")];
    assert_eq!(
        chat::select_template(Some("{{ 0 }}"), &named, None),
        Ok("{{ 0 }}")
    );
    assert_eq!(
        chat::select_template(Some("{{ 0 }}"), &named, Some("rag")),
        Ok("{{ 2 }}")
    );
    assert!(matches!(
        chat::select_template(Some("{{ 0 }}"), &named, Some("nope")),
        Err(chat::ChatError::UnknownTemplate { .. })
    ));
}

#[test]
fn leading_bos_can_be_dropped() {
    let t = ChatTemplate::new("{{ bos_token }}x", "<s>", "</s>").unwrap();
    let msgs = Data::array([]);
    let text = t.render(&chat::RenderRequest::new(&msgs)).unwrap();
    assert_eq!(t.strip_leading_bos(&text), "x");
    assert_eq!(t.strip_leading_bos("y"), "y");
}

#[test]
fn formats_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<ChatFormat>();
    shareable::<ChatTemplate>();
    shareable::<chat::ReasoningSplitter>();
}

#[test]
fn think_off_leaves_no_span_open_for_every_template() {
    // Over the whole collection: where think_ctl says the request can be honoured (template,
    // prefill), the thinking-off prompt leaves the output outside any reasoning span.
    let mut names: Vec<String> = std::fs::read_dir(common::templates_dir())
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".jinja").map(str::to_owned))
        .collect();
    names.sort();
    assert!(names.len() >= 16);
    let msgs = Data::from_json_str(r#"[{"role":"user","content":"Hi"}]"#).unwrap();
    let mut checked = 0;
    for name in &names {
        let f = format(name);
        if f.think_ctl() == ThinkCtl::None {
            continue;
        }
        let Ok(off) = f.render_prompt(&msgs, None, false, &[]) else {
            continue; // the template rejects this conversation
        };
        let mut s = f.splitter(&off);
        s.push("plain answer");
        s.finish();
        assert_eq!(
            (s.answer(), s.reasoning()),
            ("plain answer", ""),
            "{name}: {off:?}"
        );
        checked += 1;
    }
    assert!(checked >= 16, "{checked}");
}
