//! Multi-turn conversations through the public API with the verifier's prefix cache: the
//! same tokens and the same speculation (an MTP drafter opens from the snapshot of a cached
//! prefix) as with the cache off, the cached tokens reported in the stats and OpenAI's usage,
//! and API keys and salts kept apart.

use std::sync::Arc;

use candle_core::{DType, Device};
use serde_json::json;
use specd_router::{ApiKeys, DraftSource, RouterConfig};
use specd_verifier::server::{VerifierServerConfig, VerifierService};
use specd_verifier::{Gemma4Target, LocalVerifier, VerifierLimits};
use specd_wire::generation::{GenerateRequest, GenerateResponse, GenerationClient};
use tonic::transport::Channel;
use tonic::Request;

use crate::openai_client::OpenAi;
use crate::support::*;

const KEY_A: &str = "key-a-0123456789abcdef";
const KEY_B: &str = "key-b-0123456789abcdef";

/// A verifier of the Gemma 4 fixture prefilling in pieces of 8 (so short prompts span
/// several), with `cache_bytes` of prefix cache.
async fn verifier(cache_bytes: usize) -> Running {
    let target = Gemma4Target::load(&fixture("target-full"), DType::F32, &Device::Cpu)
        .unwrap()
        .with_prefill_chunk(8);
    let local = LocalVerifier::new(Arc::new(target), VerifierLimits::default())
        .with_prefix_cache(cache_bytes);
    let service = VerifierService::new(Arc::new(local), VerifierServerConfig::default());
    serve_verifier(service).await
}

/// A turn of 10 tokens; a fixed block size, so the drafts (and the rounds) depend only on
/// what the drafter is given, not on timings.
fn turn_request(prompt: &[u32], temperature: f32, salt: &str) -> GenerateRequest {
    GenerateRequest {
        cache_salt: salt.into(),
        ..sampled(
            with_block(ids_request(prompt, 10), Some(4), false),
            temperature,
            3,
        )
    }
}

async fn ask(
    client: &mut GenerationClient<Channel>,
    request: GenerateRequest,
    key: Option<&str>,
) -> GenerateResponse {
    let mut request = Request::new(request);
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    client.generate(request).await.unwrap().into_inner()
}

fn next_prompt(prompt: &[u32], answer: &[u32], turn: u32) -> Vec<u32> {
    let mut next = prompt.to_vec();
    next.extend_from_slice(answer);
    next.extend([50 + turn, 51, 52, 9]);
    next
}

#[tokio::test]
async fn conversations_are_the_same_with_the_cache_and_reuse_it() {
    let drafter = start_drafter_for(DrafterSetup::Mtp).await.unwrap();
    let (warm, cold) = (verifier(64 << 20).await, verifier(0).await);
    let source = || DraftSource::Remote(vec![drafter.url()]);
    let target = fixture("target-full");
    let warm_router = start_router(&warm, source(), &target).await;
    let cold_router = start_router(&cold, source(), &target).await;
    let mut warm_client = GenerationClient::new(warm_router.channel().await);
    let mut cold_client = GenerationClient::new(cold_router.channel().await);
    for temperature in [0.0, 0.8] {
        let mut prompt: Vec<u32> = PROMPT.iter().chain(&PROMPT).copied().collect();
        for turn in 0..3 {
            let request = turn_request(&prompt, temperature, "");
            let got = ask(&mut warm_client, request.clone(), None).await;
            let want = ask(&mut cold_client, request, None).await;
            assert_eq!(
                got.token_ids, want.token_ids,
                "t {temperature}, turn {turn}"
            );
            let (got_stats, want_stats) = (got.stats.unwrap(), want.stats.unwrap());
            // The drafter opened from the same snapshot, so it drafted the same.
            let both = format!("t {temperature}, turn {turn}: {got_stats:?} / {want_stats:?}");
            assert_eq!(got_stats.rounds, want_stats.rounds, "{both}");
            assert_eq!(got_stats.accepted, want_stats.accepted, "{both}");
            assert_eq!(want_stats.cached_prompt_tokens, 0);
            if turn > 0 || temperature > 0.0 {
                // Whole prefill pieces of an earlier prompt of this conversation.
                assert!(got_stats.cached_prompt_tokens >= 24, "{got_stats:?}");
                assert_eq!(got_stats.cached_prompt_tokens % 8, 0);
            }
            prompt = next_prompt(&prompt, &got.token_ids, turn);
        }
    }
}

#[tokio::test]
async fn api_keys_and_salts_do_not_share_cached_prefixes() {
    let warm = verifier(64 << 20).await;
    let keys = ApiKeys::parse(
        "alice:key-a-0123456789abcdef\nbob:key-b-0123456789abcdef\n",
        0,
    )
    .unwrap();
    let config = RouterConfig {
        api_keys: Some(Arc::new(keys)),
        ..RouterConfig::default()
    };
    let router = start_router_with(&warm, DraftSource::None, &fixture("target-full"), config).await;
    let mut client = GenerationClient::new(router.channel().await);
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 200 + 2).collect();
    let mut longer = prompt.clone();
    longer.extend([9, 9, 9]);
    let cached =
        |response: &GenerateResponse| response.stats.as_ref().unwrap().cached_prompt_tokens;
    let first = ask(&mut client, turn_request(&prompt, 0.0, ""), Some(KEY_A)).await;
    assert_eq!(cached(&first), 0);
    let other_key = ask(&mut client, turn_request(&longer, 0.0, ""), Some(KEY_B)).await;
    assert_eq!(cached(&other_key), 0);
    let salted = ask(&mut client, turn_request(&longer, 0.0, "s1"), Some(KEY_A)).await;
    assert_eq!(cached(&salted), 0);
    let same = ask(&mut client, turn_request(&longer, 0.0, ""), Some(KEY_A)).await;
    assert_eq!(cached(&same), 40);
    assert_eq!(same.token_ids, other_key.token_ids);
    assert_eq!(same.token_ids, salted.token_ids);
    // A salt too long is refused, naming the field.
    let long = "x".repeat(300);
    let mut request = Request::new(turn_request(&longer, 0.0, &long));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {KEY_A}").parse().unwrap());
    let status = client.generate(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().starts_with("cache_salt"), "{status:?}");
}

#[tokio::test]
async fn openai_usage_reports_cached_prompt_tokens() {
    let warm = verifier(64 << 20).await;
    let router = start_router(&warm, DraftSource::None, &fixture("target-full")).await;
    let http = OpenAi::new(router.http.unwrap());
    let prompt: Vec<u32> = (0..40).map(|i| (i * 5 + 1) % 200 + 2).collect();
    let mut longer = prompt.clone();
    longer.extend([7, 7]);
    let body = |ids: &[u32], salt: Option<&str>| {
        let mut body = json!({
            "model": SERVED_MODEL,
            "prompt": ids,
            "max_tokens": 4,
            "temperature": 0,
        });
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        body
    };
    let (status, first) = http.post("/v1/completions", &body(&prompt, None)).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, salted) = http
        .post("/v1/completions", &body(&longer, Some("t")))
        .await;
    assert_eq!(salted["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, second) = http.post("/v1/completions", &body(&longer, None)).await;
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"],
        40
    );
    assert_eq!(second["usage"]["prompt_tokens"], 42);
    assert_eq!(second["choices"][0]["text"], salted["choices"][0]["text"]);
}
