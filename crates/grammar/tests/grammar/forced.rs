//! Tokens a grammar forces, proposed as free drafts.

use specd_core::TokenConstraint;

use crate::support::{commit_each, models};

#[test]
fn the_only_property_name_is_forced_after_the_opening_quote() {
    let schema = r#"{"type": "object", "properties": {"temperature": {"type": "number"}},
        "required": ["temperature"], "additionalProperties": false}"#;
    for (name, model) in models("the_only_property_name_is_forced_after_the_opening_quote") {
        let mut constraint = model.schema(schema);
        let start = model.encode(r#"{""#);
        commit_each(model, &mut constraint, &start);
        let before = constraint.next_mask().unwrap();
        let forced = constraint.forced(16);
        let text = String::from_utf8(model.bytes(&forced)).unwrap();
        assert!(text.starts_with("temperature"), "{name}: {text:?}");
        // Forced tokens do not move the state, are allowed in turn, and respect `max`.
        assert_eq!(constraint.next_mask().unwrap(), before, "{name}");
        assert_eq!(constraint.forced(1), forced[..1], "{name}");
        assert!(constraint.forced(0).is_empty(), "{name}");
        commit_each(model, &mut constraint, &forced);
    }
}

#[test]
fn nothing_is_forced_where_the_model_has_a_choice_or_after_the_end() {
    for (name, model) in models("nothing_is_forced_where_the_model_has_a_choice_or_after_the_end") {
        let mut constraint = model.schema(r#"{"type": "string"}"#);
        commit_each(model, &mut constraint, &model.encode(r#""ab"#));
        assert!(constraint.forced(8).is_empty(), "{name}");
        commit_each(model, &mut constraint, &model.encode(r#"""#));
        assert!(constraint.is_complete(), "{name}");
        assert!(constraint.forced(8).is_empty(), "{name}");
    }
}
