//! Prefill pieces riding in verify forwards: on a target that computes every row of a forward
//! anyway (the tiny Qwen2 on the CPU engine), the batch scheduler runs a prompt's pieces in
//! the forwards of the rows decoding beside it, and several short prompts in one forward;
//! every prefill state, first token and round equals what a verifier running each request
//! alone gives, bit for bit.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use specd_core::{CacheScope, SamplingParams, SeqId, Verifier};
use specd_models::qwen2::Qwen2Model;
use specd_verifier::{
    BatchConfig, BatchVerifier, LocalVerifier, Qwen2Target, TargetCarry, VerifierLimits,
};
use tokio::sync::watch;

use crate::qwen2_support::{Rng, TempGguf, TinySpec};
use crate::support::{core_prefill, round_request};

/// Prompt tokens per prefill piece: a 45-token prompt runs in 6 pieces.
const CHUNK: usize = 8;

const SEEDED: SamplingParams = SamplingParams {
    temperature: 0.8,
    top_p: 0.95,
    top_k: 0,
    seed: 11,
};

fn target(file: &TempGguf) -> Arc<Qwen2Target> {
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    Arc::new(Qwen2Target::new(model, Vec::new()).with_prefill_chunk(CHUNK))
}

fn local(target: Arc<Qwen2Target>) -> LocalVerifier<Qwen2Target> {
    LocalVerifier::new(target, VerifierLimits::default()).with_prefix_cache(0)
}

fn bits(tensor: &Tensor) -> Vec<u32> {
    let values = tensor.flatten_all().and_then(|t| t.to_dtype(DType::F32));
    let values = values.and_then(|t| t.to_vec1::<f32>()).unwrap();
    values.into_iter().map(f32::to_bits).collect()
}

/// What a request produced: the prefill's hidden state as bits and every token.
#[derive(Debug, PartialEq)]
struct Run {
    prefill_bits: Vec<u32>,
    tokens: Vec<u32>,
}

async fn prefill<V: Verifier<Carry = TargetCarry>>(
    verifier: &V,
    seq: u64,
    prompt: &[u32],
) -> (Vec<u32>, u32) {
    let request = core_prefill(seq, prompt.to_vec(), SEEDED, true, CacheScope::global());
    let prefilled = verifier.prefill(request).await.unwrap();
    let carry = prefilled.carry.expect("a carry was asked for");
    (bits(&carry.hidden), prefilled.first_token)
}

/// Rounds of the bonus and two drafts (right where `reference` knows the continuation,
/// every third one wrong) until `max` tokens; `rounds` counts the rounds done.
async fn decode<V: Verifier<Carry = TargetCarry>>(
    verifier: &V,
    seq: u64,
    first: u32,
    max: usize,
    reference: &[u32],
    rounds: Option<&watch::Sender<usize>>,
) -> Vec<u32> {
    let mut tokens = vec![first];
    let mut round = 0;
    while tokens.len() < max {
        let room = max - tokens.len();
        let mut block = vec![*tokens.last().unwrap()];
        for i in 0..2.min(room - 1) {
            let at = tokens.len() + i;
            let right = reference.get(at).copied().unwrap_or(1);
            block.push(if at % 3 == 2 { (right + 5) % 64 } else { right });
        }
        let request = round_request(seq, round, block, tokens.len(), room);
        let verified = verifier.verify(request).await.unwrap();
        tokens.extend(verified.new_tokens);
        round += 1;
        if let Some(rounds) = rounds {
            rounds.send_replace(round as usize);
        }
    }
    verifier.release(SeqId(seq)).await.unwrap();
    tokens
}

/// Each request alone on a verifier without a scheduler.
async fn alone(target: Arc<Qwen2Target>, prompt: &[u32], seq: u64, max: usize) -> Run {
    let verifier = local(target);
    let (prefill_bits, first) = prefill(&verifier, seq, prompt).await;
    let tokens = decode(&verifier, seq, first, max, &[], None).await;
    Run {
        prefill_bits,
        tokens,
    }
}

#[tokio::test]
async fn prefill_pieces_ride_in_the_forwards_of_decoding_rows_bit_for_bit() {
    let file = TempGguf::tiny("joined-prefill", &TinySpec::default());
    let target = target(&file);
    let vocab = TinySpec::default().vocab;
    let mut rng = Rng::new(7);
    let decoding_prompt = rng.tokens(13, vocab);
    let long_prompt = rng.tokens(45, vocab);
    let short_prompts = [rng.tokens(3, vocab), rng.tokens(5, vocab)];

    let decoding = alone(target.clone(), &decoding_prompt, 1, 48).await;
    let long = alone(target.clone(), &long_prompt, 2, 10).await;
    let shorts = [
        alone(target.clone(), &short_prompts[0], 3, 6).await,
        alone(target.clone(), &short_prompts[1], 4, 6).await,
    ];

    let batch = BatchVerifier::new(Arc::new(local(target)), BatchConfig::default());
    let (decoding_bits, first) = prefill(&batch, 1, &decoding_prompt).await;
    let (rounds, mut rounds_seen) = watch::channel(0);
    let decode_run = decode(&batch, 1, first, 48, &decoding.tokens, Some(&rounds));
    let beside = async {
        // Once the decoding sequence's rows have come back twice, its return time is known.
        rounds_seen.wait_for(|&done| done >= 2).await.unwrap();
        let (long_bits, first) = prefill(&batch, 2, &long_prompt).await;
        let long_tokens = decode(&batch, 2, first, 10, &long.tokens, None).await;
        let (short_a, short_b) = tokio::join!(
            prefill(&batch, 3, &short_prompts[0]),
            prefill(&batch, 4, &short_prompts[1]),
        );
        let mut short_runs = Vec::new();
        for (seq, (short_bits, first)) in [(3, short_a), (4, short_b)] {
            let reference = &shorts[seq as usize - 3].tokens;
            let tokens = decode(&batch, seq, first, 6, reference, None).await;
            short_runs.push(Run {
                prefill_bits: short_bits,
                tokens,
            });
        }
        (
            Run {
                prefill_bits: long_bits,
                tokens: long_tokens,
            },
            short_runs,
        )
    };
    let (decoding_tokens, (long_run, short_runs)) = tokio::join!(decode_run, beside);

    assert_eq!(decoding_bits, decoding.prefill_bits);
    assert_eq!(decoding_tokens, decoding.tokens, "the decoding sequence");
    assert_eq!(long_run, long, "the prompt prefilled beside it");
    assert_eq!(short_runs[0], shorts[0], "the first short prompt");
    assert_eq!(short_runs[1], shorts[1], "the second short prompt");
    let stats = batch.stats();
    let pieces: usize = [13, 45, 3, 5]
        .iter()
        .map(|len: &usize| len.div_ceil(CHUNK))
        .sum();
    assert_eq!(stats.prefill_chunks_run as usize, pieces, "{stats:?}");
    assert!(
        stats.prefill_pieces_joined > 0,
        "no piece rode in a verify forward: {stats:?}"
    );
}
