//! The bytes of every token, as grammars see them, against the tokenizer's own decoder.

use crate::support::{gemma, models, Model, GEMMA_PADDING};

/// Every token whose decoding alone is whole text (not half a UTF-8 char) spells the same
/// bytes as the tokenizer decodes; special tokens are the marker and their name.
fn assert_round_trip(name: &str, model: &Model) {
    let special: std::collections::HashSet<u32> = model
        .tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special)
        .map(|(id, _)| id)
        .collect();
    let mut checked = 0;
    for id in 0..model.tokenizer.get_vocab_size(true) as u32 {
        let bytes = model.tokens.token_bytes(id).unwrap();
        let decoded = model.decode(&[id]);
        if special.contains(&id) {
            assert_eq!(bytes[0], 0xff, "{name} special {id}");
            assert_eq!(&bytes[1..], decoded.as_bytes(), "{name} special {id}");
        } else if !decoded.contains('\u{FFFD}') {
            assert_eq!(bytes, decoded.as_bytes(), "{name} token {id}");
            checked += 1;
        }
    }
    assert!(
        checked > model.tokenizer.get_vocab_size(true) / 2,
        "{name}: {checked}"
    );
}

#[test]
fn every_token_spells_what_the_tokenizer_decodes() {
    for (name, model) in models("every_token_spells_what_the_tokenizer_decodes") {
        assert_round_trip(name, model);
        // A space-prefixed token, a multi-byte char, and bytes split over several tokens.
        for text in [" the", " model", "ó", "ación", "🚀", "{\"name\": \"x\"}"] {
            let ids = model.encode(text);
            assert_eq!(model.bytes(&ids), text.as_bytes(), "{name} {text:?}");
            assert_eq!(model.decode(&ids), text, "{name} {text:?}");
        }
        let the = model.encode(" the");
        assert_eq!(the.len(), 1, "{name}: ' the' is one token");
    }
}

#[test]
fn byte_fallback_tokens_are_their_byte() {
    let model = gemma();
    let rocket = model.encode("🚀");
    assert_eq!(rocket.len(), 4);
    for (&id, byte) in rocket.iter().zip("🚀".bytes()) {
        assert_eq!(model.tokens.token_bytes(id).unwrap(), [byte]);
    }
}

#[test]
fn padded_model_rows_are_never_allowed_and_masks_cover_the_model() {
    let model = gemma();
    let vocab = model.tokenizer.get_vocab_size(true) + GEMMA_PADDING;
    assert_eq!(model.tokens.vocab_size(), vocab);
    assert_eq!(model.tokens.token_bytes(vocab as u32 - 1), Some(&[][..]));
    assert_eq!(model.tokens.token_bytes(vocab as u32), None);
    let mut any = model.compile(specd_grammar::OutputFormat::Regex("(.|\n)*".to_string()));
    let mask = specd_core::TokenConstraint::next_mask(&mut any).unwrap();
    assert_eq!(mask.words().len(), vocab.div_ceil(32));
    assert!(mask.ids().all(|id| (id as usize) < vocab - GEMMA_PADDING));
}

#[test]
fn a_vocabulary_without_eos_or_with_eos_past_the_model_is_refused() {
    use specd_grammar::{GrammarTokens, VocabularyError};
    let tok = &gemma().tokenizer;
    assert_eq!(
        GrammarTokens::new(tok, &[], 1024).unwrap_err(),
        VocabularyError::NoEos
    );
    assert!(matches!(
        GrammarTokens::new(tok, &[5000], 1024).unwrap_err(),
        VocabularyError::EosOutOfVocabulary { id: 5000, .. }
    ));
    assert!(matches!(
        GrammarTokens::new(tok, &[1], 0).unwrap_err(),
        VocabularyError::VocabularySize(0)
    ));
}
