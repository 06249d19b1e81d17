//! The streaming reasoning/answer split: deltas (with resets applied as the telemetry spec
//! says) always rebuild the splitter's state, arbitrary chunkings give the one-shot result,
//! and the one-shot result equals a direct reading of the rules over the whole text.

use chat::{ReasoningSplitter, ReasoningSyntax, SplitDelta};
use proptest::prelude::*;

fn think() -> ReasoningSyntax {
    ReasoningSyntax::Tags {
        open: "<think>".into(),
        close: "</think>".into(),
    }
}

fn gemma() -> ReasoningSyntax {
    ReasoningSyntax::Tags {
        open: "<|channel>thought".into(),
        close: "<channel|>".into(),
    }
}

/// Feeds `chunks`, checks after every push that the applied deltas equal the splitter's
/// state, and returns the final (answer, reasoning, number of resets).
fn stream(syntax: &ReasoningSyntax, prompt: &str, chunks: &[&str]) -> (String, String, usize) {
    let mut s = ReasoningSplitter::new(syntax, prompt);
    let (mut answer, mut reasoning, mut resets) = (String::new(), String::new(), 0);
    let mut apply = |d: SplitDelta, s: &ReasoningSplitter| {
        resets += usize::from(d.reset);
        d.apply(&mut answer, &mut reasoning);
        assert_eq!(answer, s.answer());
        assert_eq!(reasoning, s.reasoning());
    };
    for c in chunks {
        let d = s.push(c);
        apply(d, &s);
    }
    let d = s.finish();
    apply(d, &s);
    (answer, reasoning, resets)
}

/// The rules read directly over the whole text (no streaming): span bodies are reasoning
/// (whitespace trimmed at its start, at the end of each span and at the end), the rest is
/// answer (whitespace after a closing tag dropped); a closing tag before any tag moves the
/// answer so far into the reasoning.
fn oracle_tags(text: &str, open: &str, close: &str, mut in_span: bool) -> (String, String) {
    let (mut answer, mut reasoning) = (String::new(), String::new());
    let (mut seen, mut skip_ws) = (false, false);
    let mut rest = text;
    let add_answer = |piece: &str, answer: &mut String, skip_ws: &mut bool| {
        let piece = if *skip_ws { piece.trim_start() } else { piece };
        if !piece.is_empty() {
            *skip_ws = false;
        }
        answer.push_str(piece);
    };
    loop {
        if in_span {
            match rest.find(close) {
                Some(i) => {
                    reasoning.push_str(rest[..i].trim_end());
                    rest = &rest[i + close.len()..];
                    in_span = false;
                    seen = true;
                    skip_ws = true;
                }
                None => {
                    reasoning.push_str(rest.trim_end());
                    break;
                }
            }
            if reasoning.trim_start().is_empty() {
                reasoning.clear();
            }
            continue;
        }
        let o = rest.find(open);
        let c = if seen { None } else { rest.find(close) };
        match (o, c) {
            (Some(o), Some(c)) if c < o => {
                let piece = &rest[..c];
                add_answer(piece, &mut answer, &mut skip_ws);
                reasoning = format!("{reasoning}{answer}").trim().to_owned();
                answer.clear();
                rest = &rest[c + close.len()..];
                seen = true;
                skip_ws = true;
            }
            (None, Some(c)) => {
                let piece = &rest[..c];
                add_answer(piece, &mut answer, &mut skip_ws);
                reasoning = format!("{reasoning}{answer}").trim().to_owned();
                answer.clear();
                rest = &rest[c + close.len()..];
                seen = true;
                skip_ws = true;
            }
            (Some(o), _) => {
                add_answer(&rest[..o], &mut answer, &mut skip_ws);
                rest = &rest[o + open.len()..];
                in_span = true;
                seen = true;
            }
            (None, None) => {
                add_answer(rest, &mut answer, &mut skip_ws);
                break;
            }
        }
    }
    (answer, reasoning.trim_start().to_owned())
}

fn chunk<'a>(text: &'a str, cuts: &[usize]) -> Vec<&'a str> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| c % (text.len() + 1))
        .map(|mut p| {
            while !text.is_char_boundary(p) {
                p -= 1;
            }
            p
        })
        .collect();
    points.push(0);
    points.push(text.len());
    points.sort_unstable();
    points.dedup();
    points.windows(2).map(|w| &text[w[0]..w[1]]).collect()
}

fn tag_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("<think>".to_owned()),
        Just("</think>".to_owned()),
        Just("<thi".to_owned()),
        Just("</th".to_owned()),
        Just("<".to_owned()),
        Just(" ".to_owned()),
        Just("\n\n".to_owned()),
        Just("é".to_owned()),
        "[a-z]{1,5}",
    ];
    prop::collection::vec(piece, 0..14).prop_map(|v| v.concat())
}

fn harmony_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("<|channel|>analysis<|message|>".to_owned()),
        Just("<|channel|>final<|message|>".to_owned()),
        Just("<|channel|>commentary to=functions.f <|constrain|>json<|message|>".to_owned()),
        Just("<|end|>".to_owned()),
        Just("<|start|>assistant".to_owned()),
        Just("<|return|>".to_owned()),
        Just("<|".to_owned()),
        Just("<|chan".to_owned()),
        Just(" ".to_owned()),
        Just("ü".to_owned()),
        "[a-z]{1,5}",
    ];
    prop::collection::vec(piece, 0..14).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn tags_any_chunking(text in tag_text(), cuts in prop::collection::vec(0usize..200, 0..8), opened in any::<bool>()) {
        let prompt = if opened { "<|im_start|>assistant\n<think>\n" } else { "<|im_start|>assistant\n" };
        let (answer, reasoning) = ReasoningSplitter::split_all(&think(), prompt, &text);
        let (sa, sr, _) = stream(&think(), prompt, &chunk(&text, &cuts));
        prop_assert_eq!((&sa, &sr), (&answer, &reasoning));
        let (oa, or) = oracle_tags(&text, "<think>", "</think>", opened);
        prop_assert_eq!((&answer, &reasoning), (&oa, &or));
    }

    #[test]
    fn any_tag_pair_any_chunking(
        open in "[<a/é>]{0,3}",
        close in "[<a/é>]{0,3}",
        prompt in "[<a/é> ]{0,6}",
        text in "[<a/é> ]{0,24}",
        cuts in prop::collection::vec(0usize..40, 0..6),
    ) {
        let syntax = ReasoningSyntax::Tags { open, close };
        let (answer, reasoning) = ReasoningSplitter::split_all(&syntax, &prompt, &text);
        let (sa, sr, _) = stream(&syntax, &prompt, &chunk(&text, &cuts));
        prop_assert_eq!((sa, sr), (answer, reasoning));
    }

    #[test]
    fn harmony_any_chunking(text in harmony_text(), cuts in prop::collection::vec(0usize..300, 0..8), prefilled in any::<bool>()) {
        let prompt = if prefilled {
            "<|start|>assistant<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>"
        } else {
            "<|start|>assistant"
        };
        let (answer, reasoning) = ReasoningSplitter::split_all(&ReasoningSyntax::Harmony, prompt, &text);
        let (sa, sr, resets) = stream(&ReasoningSyntax::Harmony, prompt, &chunk(&text, &cuts));
        prop_assert_eq!((&sa, &sr), (&answer, &reasoning));
        prop_assert_eq!(resets, 0);
        // Markers never leak into either side.
        prop_assert!(!answer.contains("<|end|>") && !reasoning.contains("<|end|>"));
    }
}

#[test]
fn closing_tag_after_answer_text_resets() {
    // The prompt did not open a span; the model reasons untagged, then closes.
    let mut s = ReasoningSplitter::new(&think(), "<|im_start|>assistant\n");
    let d1 = s.push("Let me see: 2+2");
    assert_eq!(
        d1,
        SplitDelta {
            text: "Let me see: 2+2".into(),
            reasoning: String::new(),
            reset: false
        }
    );
    let d2 = s.push(" is 4.</thi");
    assert_eq!(
        d2,
        SplitDelta {
            text: " is 4.".into(),
            reasoning: String::new(),
            reset: false
        }
    );
    let d3 = s.push("nk>\n\nFour");
    assert_eq!(
        d3,
        SplitDelta {
            text: "Four".into(),
            reasoning: "Let me see: 2+2 is 4.".into(),
            reset: true
        }
    );
    let d4 = s.push(".");
    assert_eq!(
        d4,
        SplitDelta {
            text: ".".into(),
            reasoning: String::new(),
            reset: false
        }
    );
    s.finish();
    assert_eq!(
        (s.answer(), s.reasoning()),
        ("Four.", "Let me see: 2+2 is 4.")
    );
}

#[test]
fn span_opened_by_the_prompt_is_reasoning_until_closed() {
    let mut s = ReasoningSplitter::new(&think(), "<｜Assistant｜><think>\n");
    let d = s.push("step one\n");
    assert_eq!(
        (d.text.as_str(), d.reasoning.as_str(), d.reset),
        ("", "step one", false)
    );
    let d = s.push("</think>Done");
    assert_eq!(
        (d.text.as_str(), d.reasoning.as_str(), d.reset),
        ("Done", "", false)
    );
    // A run that ends inside the span is all reasoning.
    let (a, r) = ReasoningSplitter::split_all(&think(), "<think>", "still thinking  ");
    assert_eq!((a.as_str(), r.as_str()), ("", "still thinking"));
}

#[test]
fn partial_tags_are_held_back_then_released() {
    let mut s = ReasoningSplitter::new(&think(), "");
    assert_eq!(s.push("a <th").text, "a ");
    assert_eq!(s.push("ey").text, "<they");
    let d = s.push("<");
    assert_eq!(d.text, "");
    assert_eq!(s.finish().text, "<");
    assert_eq!(s.answer(), "a <they<");
}

#[test]
fn gemma_channel_span() {
    let (a, r) = ReasoningSplitter::split_all(
        &gemma(),
        "<|turn>model\n",
        "<|channel>thought\nThe user greets.\n<channel|>Hello!",
    );
    assert_eq!((a.as_str(), r.as_str()), ("Hello!", "The user greets."));
}

#[test]
fn harmony_channels() {
    let out = "<|channel|>analysis<|message|>Need weather.<|end|>\
               <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
    let (a, r) = ReasoningSplitter::split_all(&ReasoningSyntax::Harmony, "<|start|>assistant", out);
    assert_eq!(r, "Need weather.");
    assert_eq!(a, "{\"city\":\"Paris\"}");
    let (a, r) = ReasoningSplitter::split_all(
        &ReasoningSyntax::Harmony,
        "<|start|>assistant",
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer.<|return|>",
    );
    assert_eq!((a.as_str(), r.as_str()), ("Answer.", "Think."));
}

#[test]
fn no_syntax_is_all_answer() {
    let (a, r) = ReasoningSplitter::split_all(&ReasoningSyntax::None, "", "<think>x</think> y");
    assert_eq!((a.as_str(), r.as_str()), ("<think>x</think> y", ""));
}

#[test]
fn empty_tags_never_match() {
    // A syntax with an empty tag (not produced by ChatFormat, but constructible) must not
    // loop or match everywhere.
    let syntax = ReasoningSyntax::Tags {
        open: String::new(),
        close: "</x>".into(),
    };
    let (a, r) = ReasoningSplitter::split_all(&syntax, "", "abc</x> d");
    assert_eq!((a.as_str(), r.as_str()), ("d", "abc"));
    let syntax = ReasoningSyntax::Tags {
        open: "<x>".into(),
        close: String::new(),
    };
    let (a, r) = ReasoningSplitter::split_all(&syntax, "<x>", "abc");
    assert_eq!((a.as_str(), r.as_str()), ("", "abc"));
}

#[test]
fn a_marker_a_longer_one_may_extend_waits() {
    // The opening tag is a prefix of the closing one: "<a" then "/" is the closing tag, in one
    // push or two.
    let syntax = ReasoningSyntax::Tags {
        open: "<a".into(),
        close: "<a/".into(),
    };
    let whole = ReasoningSplitter::split_all(&syntax, "", "xy<a/z");
    assert_eq!(whole, ("z".to_owned(), "xy".to_owned()));
    let (a, r, resets) = stream(&syntax, "", &["xy<a", "/z"]);
    assert_eq!((a, r, resets), ("z".to_owned(), "xy".to_owned(), 1));
    // At the end of the text the shorter tag is taken.
    let (a, r, _) = stream(&syntax, "", &["q<a"]);
    assert_eq!((a.as_str(), r.as_str()), ("q", ""));
}
