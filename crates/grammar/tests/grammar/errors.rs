//! Formats that cannot constrain a request fail with the part at fault, quickly, and
//! never take the process down.

use std::time::{Duration, Instant};

use specd_core::TokenConstraint;
use specd_grammar::{GrammarError, GrammarErrorKind, GrammarLimits, OutputFormat};

use crate::support::{gemma, models};

fn compile(format: &OutputFormat) -> Result<specd_grammar::GrammarConstraint, GrammarError> {
    gemma().tokens.compile(format, &GrammarLimits::default())
}

#[test]
fn each_bad_format_names_its_kind() {
    let cases = [
        (
            OutputFormat::JsonSchema("{\"type\": ".into()),
            GrammarErrorKind::Schema,
        ),
        (
            OutputFormat::JsonSchema(r#"{"type": "strong"}"#.into()),
            GrammarErrorKind::Schema,
        ),
        (
            OutputFormat::JsonSchema(r##"{"$ref": "#/$defs/missing"}"##.into()),
            GrammarErrorKind::Schema,
        ),
        (OutputFormat::Regex("(ab".into()), GrammarErrorKind::Regex),
        (
            OutputFormat::Regex("a{2,1}".into()),
            GrammarErrorKind::Regex,
        ),
        (
            OutputFormat::Lark("start: missing_rule".into()),
            GrammarErrorKind::Lark,
        ),
        (
            OutputFormat::Lark("start: \"a\" (".into()),
            GrammarErrorKind::Lark,
        ),
        (OutputFormat::Lark("".into()), GrammarErrorKind::Lark),
    ];
    for (format, kind) in cases {
        let err = compile(&format).unwrap_err();
        assert_eq!(err.kind(), kind, "{format:?}: {err}");
        assert_eq!(err.field(), kind.as_str());
        assert!(!err.message().is_empty(), "{format:?}");
        assert!(!err.message().contains("backtrace"), "{format:?}: {err}");
    }
    let err = compile(&OutputFormat::JsonSchema("[1,".into())).unwrap_err();
    assert!(err.message().contains("not JSON"), "{err}");
    let err = compile(&OutputFormat::Regex("(ab".into())).unwrap_err();
    assert!(err.message().contains("unclosed group"), "{err}");
}

#[test]
fn sources_over_the_size_limits_are_refused_before_parsing() {
    let limits = GrammarLimits::default();
    let schema = format!(
        "{{\"enum\": [{}]}}",
        vec!["1"; limits.max_schema_bytes / 2].join(",")
    );
    let lark = format!("start: \"{}\"", "a".repeat(limits.max_grammar_bytes));
    let props: Vec<String> = (0..=limits.max_object_properties)
        .map(|i| format!("\"p{i}\": {{}}"))
        .collect();
    let wide = format!(
        "{{\"type\": \"array\", \"items\": {{\"properties\": {{{}}}}}}}",
        props.join(",")
    );
    let cases = [
        (
            OutputFormat::JsonSchema(schema),
            GrammarErrorKind::Schema,
            "over the limit",
        ),
        (
            OutputFormat::Lark(lark.clone()),
            GrammarErrorKind::Lark,
            "over the limit",
        ),
        (
            OutputFormat::Regex(lark),
            GrammarErrorKind::Regex,
            "over the limit",
        ),
        (
            OutputFormat::JsonSchema(wide),
            GrammarErrorKind::Schema,
            "properties",
        ),
    ];
    for (format, kind, says) in cases {
        let started = Instant::now();
        let err = compile(&format).unwrap_err();
        assert_eq!(err.kind(), kind, "{err}");
        assert!(err.message().contains(says), "{err}");
        assert!(started.elapsed() < Duration::from_millis(200));
    }
}

/// Grammars small as text but huge once compiled fail on llguidance's limits, when
/// compiled or at the first tokens, rather than stalling the request thread.
#[test]
fn grammars_that_blow_up_fail_fast() {
    let alternatives: Vec<String> = (0..5_000).map(|i| format!("\"w{i}\"")).collect();
    let cases = [
        (
            "5000 alternatives",
            format!("start: {}", alternatives.join("|")),
        ),
        (
            "a million a's",
            "start: x{1000}\nx: y{1000}\ny: \"a\"".to_string(),
        ),
    ];
    let models = models("grammars_that_blow_up_fail_fast");
    for (name, lark) in cases {
        for &(model_name, model) in &models {
            let started = Instant::now();
            let failure = match model
                .tokens
                .compile(&OutputFormat::Lark(lark.clone()), &GrammarLimits::default())
            {
                Err(err) => err.to_string(),
                Ok(mut constraint) => walk_until_refused(&mut constraint),
            };
            let elapsed = started.elapsed();
            assert!(
                failure.contains("Too many items") || failure.contains("max is 2000"),
                "{name} on {model_name}: {failure}"
            );
            assert!(
                elapsed < Duration::from_secs(2),
                "{name} on {model_name}: {elapsed:?}"
            );
        }
    }
}

/// The error that ends a walk taking the lowest allowed token, within a few tokens.
fn walk_until_refused(constraint: &mut specd_grammar::GrammarConstraint) -> String {
    for _ in 0..8 {
        let step = constraint.next_mask().and_then(|mask| {
            let id = mask.ids().next().unwrap_or(u32::MAX);
            constraint.commit(&[id])
        });
        if let Err(err) = step {
            return err.to_string();
        }
    }
    "no error".to_string()
}

#[test]
fn a_tight_grammar_size_limit_refuses_what_the_default_takes() {
    let alternatives: Vec<String> = (0..1_000).map(|i| format!("\"w{i}\"")).collect();
    let lark = OutputFormat::Lark(format!("start: {}", alternatives.join("|")));
    assert!(compile(&lark).is_ok());
    let tight = GrammarLimits {
        max_grammar_size: 500,
        ..GrammarLimits::default()
    };
    let err = gemma().tokens.compile(&lark, &tight).unwrap_err();
    assert_eq!(err.kind(), GrammarErrorKind::Lark);
    assert!(err.message().contains("size"), "{err}");
}

/// llguidance compiles a chain of `$ref`s recursively, ~10 kB of stack a link: a long
/// chain compiles (on the compiler's own stack) instead of aborting the process, from a
/// test thread's 2 MiB stack.
#[test]
fn a_deep_ref_chain_compiles_without_overflowing_the_stack() {
    let links = 3_000;
    let defs: Vec<String> = (0..links)
        .map(|i| {
            format!(
                "\"d{i}\": {{\"type\": \"object\", \"properties\": {{\"x\": {{\"$ref\": \"#/$defs/d{}\"}}}}}}",
                i + 1
            )
        })
        .collect();
    let schema = format!(
        "{{\"$defs\": {{{}, \"d{links}\": {{\"type\": \"integer\"}}}}, \"$ref\": \"#/$defs/d0\"}}",
        defs.join(",")
    );
    let mut constraint = compile(&OutputFormat::JsonSchema(schema)).unwrap();
    let mask = constraint.next_mask().unwrap();
    assert!(mask.count() > 0);
}
