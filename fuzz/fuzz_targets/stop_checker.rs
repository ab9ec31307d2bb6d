//! The stop checker over an arbitrary byte-level vocabulary, stop strings, stop ids and
//! token stream (layout in `specd_fuzz::stop_case`): it must never panic, never show a stop
//! string, never emit past `max_tokens`, and with a prefix-stable vocabulary of whole
//! characters show exactly the text of the emitted tokens up to the stop.
#![no_main]

use libfuzzer_sys::fuzz_target;
use specd_core::stop::{StopChecker, StopConditions};
use specd_core::FinishReason;
use specd_fuzz::stop_case::{StopCase, CANCEL_AT_END, IGNORE_EOS, STRIP_LEADING_SPACE};

fuzz_target!(|data: &[u8]| {
    let case = StopCase::parse(data);
    let ids = |bytes: &[u8]| bytes.iter().map(|&b| u32::from(b)).collect::<Vec<u32>>();
    let conditions = StopConditions {
        max_tokens: usize::from(case.max_tokens),
        eos_token_ids: ids(&case.eos_ids),
        ignore_eos: case.has(IGNORE_EOS),
        stop_token_ids: ids(&case.stop_ids),
        // Requests with an empty stop string are refused before they get here.
        stop_strings: case
            .stop_strings
            .iter()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect(),
    };
    let detokenizer = case.detokenizer();
    let mut checker = StopChecker::new(&detokenizer, conditions.clone(), &ids(&case.context));

    let mut text = String::new();
    let mut emitted = Vec::new();
    let mut finish = None;
    let mut failed = false;
    for token in ids(&case.tokens) {
        match checker.push(token) {
            Ok(out) if finish.is_some() => {
                assert_eq!(out.finish, finish, "finish reason is not sticky");
                assert!(out.text.is_empty(), "text after the finish");
            }
            Ok(out) => {
                text.push_str(&out.text);
                emitted.push(token);
                finish = out.finish;
            }
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    if !failed && finish.is_none() && case.has(CANCEL_AT_END) {
        if let Ok(out) = checker.finish(FinishReason::Cancelled) {
            assert_eq!(out.finish, Some(FinishReason::Cancelled));
            text.push_str(&out.text);
            finish = out.finish;
        }
    }

    assert!(checker.emitted() <= conditions.max_tokens.max(1));
    if !failed {
        assert_eq!(checker.emitted(), emitted.len());
        assert_eq!(checker.finish_reason(), finish);
    }
    for stop in &conditions.stop_strings {
        assert!(
            !text.contains(stop.as_str()),
            "shown text contains {stop:?}"
        );
    }

    // With whole characters per piece and plain concatenation, the text is fully known.
    let whole_chars = case.pieces.iter().all(|p| std::str::from_utf8(p).is_ok());
    if failed || !whole_chars || case.has(STRIP_LEADING_SPACE) {
        return;
    }
    let shown_ids: Vec<u32> = emitted
        .iter()
        .copied()
        .filter(|&t| !conditions.is_eos(t) && !conditions.is_stop_token(t))
        .collect();
    let full = String::from_utf8(detokenizer.bytes(&shown_ids).expect("ids decoded"))
        .expect("whole characters");
    assert!(
        full.starts_with(&text),
        "{text:?} is not a prefix of {full:?}"
    );
    if finish.is_some() {
        let rest = &full[text.len()..];
        let cut_at_stop = conditions
            .stop_strings
            .iter()
            .any(|s| rest.starts_with(s.as_str()));
        assert!(
            rest.is_empty() || cut_at_stop,
            "finished text {text:?} stops short of {full:?}"
        );
    }
});
