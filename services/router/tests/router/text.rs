//! Text in and out through a tokenizer.json in the target directory: text prompts, text
//! deltas and stop strings.

use std::path::PathBuf;

use specd_wire::generation::{generate_request, FinishReason, GenerateRequest};
use tokenizers::Tokenizer;

use crate::support::*;

fn target_with_tokenizer() -> (PathBuf, Tokenizer) {
    word_level_target("text")
}

fn text_request(prompt: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        input: Some(generate_request::Input::Prompt(prompt.into())),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..GenerateRequest::default()
    }
}

const TEXT: &str = "w2 w40 w41 w42 w43 w9 w40 w41 w42 w43 w9 w40 w41 w42 w43 w9";

#[tokio::test]
async fn text_prompts_and_text_deltas() {
    let (dir, tokenizer) = target_with_tokenizer();
    let stack = Stack::start_in(Some(DrafterSetup::Ngram), &dir).await;
    let mut client = stack.client().await;

    // The text prompt tokenizes to PROMPT, so it generates what the ids do.
    let by_text = generate(&mut client, text_request(TEXT, 20)).await.unwrap();
    let by_ids = generate(&mut client, ids_request(&PROMPT, 20))
        .await
        .unwrap();
    assert_eq!(by_text.token_ids, by_ids.token_ids);
    assert_eq!(by_text.stats.unwrap().prompt_tokens, PROMPT.len() as u32);
    let decoded = tokenizer.decode(&by_text.token_ids, false).unwrap();
    assert_eq!(by_text.text.trim(), decoded.trim());

    // The stream's text deltas add up to the same text.
    let mut stream = client
        .generate_stream(text_request(TEXT, 20))
        .await
        .unwrap()
        .into_inner();
    let mut streamed = String::new();
    while let Some(message) = stream.message().await.unwrap() {
        streamed.push_str(&message.text);
    }
    assert_eq!(streamed, by_text.text);
}

#[tokio::test]
async fn a_stop_string_ends_generation_before_it() {
    let (dir, tokenizer) = target_with_tokenizer();
    let stack = Stack::start_in(Some(DrafterSetup::RandomMtp), &dir).await;
    let mut client = stack.client().await;
    let full = generate(&mut client, text_request(TEXT, 30)).await.unwrap();
    // Stop at the word of the 6th token (its first occurrence in the completion).
    let word = format!("w{}", full.token_ids[5]);
    let mut request = text_request(TEXT, 30);
    request.stop = vec!["never-generated".into(), word.clone()];
    let stopped = generate(&mut client, request).await.unwrap();

    assert_eq!(stopped.finish_reason(), FinishReason::Stop);
    assert_eq!(stopped.matched_stop, word);
    // The tokens are a prefix of the full completion, ending with the one that completed
    // the match; the text stops right before the match.
    let n = stopped.token_ids.len();
    assert_eq!(stopped.token_ids, full.token_ids[..n]);
    let text = tokenizer.decode(&stopped.token_ids, false).unwrap();
    let at = text
        .find(&word)
        .expect("the stop string is in the decoded tokens");
    assert!(!tokenizer
        .decode(&stopped.token_ids[..n - 1], false)
        .unwrap()
        .contains(&word));
    assert_eq!(stopped.text.trim(), text[..at].trim());
    assert!(!stopped.text.contains(&word));
}
