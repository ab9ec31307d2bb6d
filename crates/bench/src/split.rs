//! Generations through the public `specd.v1.Generation` API of a router in this process.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use specd_wire::generation::{
    generate_request, GenerateRequest, GenerationClient, SamplingParams, SpeculativeParams,
    TokenIds,
};

use super::report::RunSample;

/// Greedy decoding of exactly `max_tokens` tokens (end-of-sequence ignored) through the
/// public API, with the speculation of `speculative`.
pub(super) fn greedy_request(
    ids: Vec<u32>,
    max_tokens: u32,
    speculative: SpeculativeParams,
) -> GenerateRequest {
    GenerateRequest {
        input: Some(generate_request::Input::PromptIds(TokenIds { ids })),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        stop: Vec::new(),
        sampling: Some(SamplingParams {
            temperature: Some(0.0),
            top_p: Some(1.0),
            top_k: Some(0),
            seed: Some(0),
            ..Default::default()
        }),
        speculative: Some(speculative),
        cache_salt: String::new(),
        ..Default::default()
    }
}

/// One streamed generation and the gaps between its token chunks.
pub struct ClientRun {
    pub sample: RunSample,
    /// Time between consecutive chunks after the first (one chunk per round).
    pub chunk_gaps: Vec<Duration>,
    /// From the call to the first chunk with tokens.
    pub first_token: Option<Duration>,
}

/// How a split generation asks to speculate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitBlock {
    Plain,
    Fixed(usize),
    /// The router's adaptive, cost-aware block size.
    Adaptive,
}

pub async fn generate(
    router_url: &str,
    prompt_ids: &[u32],
    max_tokens: usize,
    block: SplitBlock,
) -> Result<ClientRun> {
    let mut client = GenerationClient::connect(router_url.to_owned())
        .await
        .context("connecting to the benchmark router")?;
    let max_tokens = u32::try_from(max_tokens).context("max_tokens: exceeds 32 bits")?;
    let speculative = match block {
        SplitBlock::Plain => SpeculativeParams {
            block_size: None,
            disabled: true,
            ..Default::default()
        },
        SplitBlock::Fixed(size) => SpeculativeParams {
            block_size: Some(u32::try_from(size).context("block_size: exceeds 32 bits")?),
            disabled: false,
            ..Default::default()
        },
        SplitBlock::Adaptive => SpeculativeParams {
            block_size: None,
            disabled: false,
            ..Default::default()
        },
    };
    let request = greedy_request(prompt_ids.to_vec(), max_tokens, speculative);
    let start = Instant::now();
    let mut stream = client
        .generate_stream(request)
        .await
        .context("GenerateStream")?
        .into_inner();
    let mut tokens = 0;
    let mut last_chunk: Option<Instant> = None;
    let mut chunk_gaps = Vec::new();
    let mut first_token = None;
    let mut stats = None;
    while let Some(message) = stream.message().await.context("GenerateStream")? {
        if !message.token_ids.is_empty() {
            let now = Instant::now();
            first_token.get_or_insert(now - start);
            if let Some(last) = last_chunk {
                chunk_gaps.push(now - last);
            }
            last_chunk = Some(now);
            tokens += message.token_ids.len();
        }
        if message.stats.is_some() {
            stats = message.stats;
        }
    }
    let elapsed = start.elapsed();
    let stats = stats.context("GenerateStream: no stats in the final message")?;
    Ok(ClientRun {
        sample: RunSample {
            tokens,
            elapsed,
            rounds: u64::from(stats.rounds),
            accepted: u64::from(stats.accepted),
            ..RunSample::default()
        },
        chunk_gaps,
        first_token,
    })
}
