//! JSON schemas driven by real tokenizations of documents.

use specd_core::TokenConstraint;
use specd_grammar::OutputFormat;

use crate::support::{commit_each, models};

pub const PERSON: &str = r#"{
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": false
}"#;

#[test]
fn a_valid_document_is_allowed_token_by_token_and_completes() {
    for (name, model) in models("a_valid_document_is_allowed_token_by_token_and_completes") {
        let mut constraint = model.schema(PERSON);
        assert!(!constraint.is_complete());
        let doc = model.encode(r#"{"name": "x", "age": 3}"#);
        commit_each(model, &mut constraint, &doc);
        // The object is closed: only the end of the sequence may follow, any of them.
        let mask = constraint.next_mask().unwrap();
        assert_eq!(mask.ids().collect::<Vec<_>>(), sorted(&model.eos), "{name}");
        assert!(constraint.is_complete(), "{name}");
        // The model ends on whichever EOS it likes, not only llguidance's first one.
        constraint.commit(&[*model.eos.last().unwrap()]).unwrap();
        assert!(constraint.is_complete(), "{name}");
        assert!(
            constraint.commit(&doc[..1]).is_err(),
            "{name}: nothing after the end"
        );
    }
}

#[test]
fn a_document_the_schema_refuses_is_cut_at_the_first_wrong_token() {
    for (name, model) in models("a_document_the_schema_refuses_is_cut_at_the_first_wrong_token") {
        let mut constraint = model.schema(PERSON);
        let doc = model.encode(r#"{"name": "x", "age": "three"}"#);
        let valid = model.encode(r#"{"name": "x", "age": "#);
        let prefix = doc.iter().zip(&valid).take_while(|(a, b)| a == b).count();
        commit_each(model, &mut constraint, &doc[..prefix]);
        let mask = constraint.next_mask().unwrap();
        let refused = doc[prefix..]
            .iter()
            .position(|&id| !mask.allows(id))
            .map(|i| prefix + i);
        assert_eq!(refused, Some(prefix), "{name}: the quote before 'three'");
        let error = constraint.commit(&doc[prefix..prefix + 1]).unwrap_err();
        assert!(error.0.contains("refused"), "{name}: {error}");
        // Broken for good: the request fails rather than carrying on unconstrained.
        assert!(constraint.next_mask().is_err(), "{name}");
        assert!(!constraint.is_complete(), "{name}");
    }
}

#[test]
fn an_end_of_sequence_before_the_object_closes_is_refused() {
    for (name, model) in models("an_end_of_sequence_before_the_object_closes_is_refused") {
        let mut constraint = model.schema(PERSON);
        let doc = model.encode(r#"{"name": "x""#);
        commit_each(model, &mut constraint, &doc);
        let mask = constraint.next_mask().unwrap();
        assert!(model.eos.iter().all(|&id| !mask.allows(id)), "{name}");
        assert!(constraint.commit(&model.eos[..1]).is_err(), "{name}");
    }
}

#[test]
fn json_object_takes_any_object_and_nothing_else() {
    for (name, model) in models("json_object_takes_any_object_and_nothing_else") {
        let mut constraint = model.compile(OutputFormat::JsonObject);
        let doc = model.encode(r#"{"a": [1, 2.5, null], "b": {"c": true}}"#);
        commit_each(model, &mut constraint, &doc);
        assert!(constraint.is_complete(), "{name}");

        let mut constraint = model.compile(OutputFormat::JsonObject);
        let mask = constraint.next_mask().unwrap();
        let array = model.encode("[1]");
        assert!(!mask.allows(array[0]), "{name}: an array is not an object");
    }
}

/// A "model" that always picks the lowest allowed id: every step must offer something,
/// and the walk must end in a document the tokenizer decodes and the schema accepts.
#[test]
fn the_lowest_allowed_token_walk_ends_in_a_valid_document() {
    let schema = r#"{"type": "object", "properties": {
        "ok": {"type": "boolean"}, "n": {"enum": [1, 2]}}, "required": ["ok", "n"],
        "additionalProperties": false}"#;
    for (name, model) in models("the_lowest_allowed_token_walk_ends_in_a_valid_document") {
        let mut constraint = model.schema(schema);
        let mut out = Vec::new();
        while !constraint.is_complete() {
            assert!(out.len() < 200, "{name}: {:?}", model.decode(&out));
            let mask = constraint.next_mask().unwrap();
            let id = mask.ids().next().unwrap();
            // Whitespace is allowed between JSON tokens; a lowest-id model would write it
            // forever, so skip to the next choice when the lowest one is blank.
            let id = mask
                .ids()
                .find(|&id| !model.decode(&[id]).trim().is_empty())
                .unwrap_or(id);
            constraint.commit(&[id]).unwrap();
            out.push(id);
        }
        let text = model.decode(&out);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(
            doc["ok"].is_boolean() && doc["n"].is_i64(),
            "{name}: {text}"
        );
    }
}

fn sorted(ids: &[u32]) -> Vec<u32> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids
}
