//! Regexes and Lark grammars, on whole outputs.

use specd_core::TokenConstraint;
use specd_grammar::OutputFormat;

use crate::support::{commit_each, models};

#[test]
fn a_regex_walk_ends_when_the_pattern_is_matched() {
    for (name, model) in models("a_regex_walk_ends_when_the_pattern_is_matched") {
        let mut constraint = model.compile(OutputFormat::Regex(r"[a-c]{3}-[0-9]{2}".to_string()));
        let mut out = Vec::new();
        while !constraint.is_complete() {
            assert!(out.len() < 16, "{name}");
            let id = constraint.next_mask().unwrap().ids().next().unwrap();
            constraint.commit(&[id]).unwrap();
            out.push(id);
        }
        let text = String::from_utf8(model.bytes(&out)).unwrap();
        assert_eq!(text, "aaa-00", "{name}");
    }
}

#[test]
fn a_lark_grammar_takes_its_language() {
    let grammar = r#"
        start: call
        call: NAME "(" args? ")"
        args: NUMBER ("," " "? NUMBER)*
        NAME: /[a-z_]+/
        NUMBER: /[0-9]+/
    "#;
    for (name, model) in models("a_lark_grammar_takes_its_language") {
        let mut constraint = model.compile(OutputFormat::Lark(grammar.to_string()));
        commit_each(model, &mut constraint, &model.encode("add(1, 22)"));
        assert!(constraint.is_complete(), "{name}");

        let mut constraint = model.compile(OutputFormat::Lark(grammar.to_string()));
        let bad = model.encode("add[1]");
        let block = constraint.block_masks(&bad).unwrap();
        assert!(block.kept < bad.len(), "{name}");
    }
}
