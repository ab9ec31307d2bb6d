//! The prefix cache: multi-turn conversations run on a verifier with it and one without,
//! token for token and bit for bit the same (first-token hidden state, the K/V shipped to a
//! drafter, every emitted token), greedy and seeded, plain and speculative, on both target
//! families; bounded, scoped, and never in the way of admission.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use specd_core::{CacheScope, SamplingParams, SeqId, Verifier};
use specd_models::qwen2::Qwen2Model;
use specd_verifier::{
    BatchConfig, BatchVerifier, Gemma4Target, KvBudget, LocalVerifier, Qwen2Target, TargetCarry,
    TargetModel, VerifierLimits,
};

use crate::qwen2_support::{TempGguf, TinySpec};
use crate::support::{core_prefill, plain_round, round_request, target_with_chunk};

const GREEDY: SamplingParams = SamplingParams {
    temperature: 0.0,
    top_p: 1.0,
    top_k: 0,
    seed: 0,
};

const SEEDED: SamplingParams = SamplingParams {
    temperature: 0.8,
    top_p: 0.95,
    top_k: 0,
    seed: 5,
};

/// What one turn produced, for comparing a cached run with a cold one.
#[derive(Debug)]
struct Turn {
    tokens: Vec<u32>,
    /// The prefill's last hidden state and (Gemma 4) the shared K/V snapshot, as bits.
    prefill_bits: Vec<u32>,
    cached: usize,
}

fn bits(tensor: &Tensor) -> Vec<u32> {
    tensor
        .flatten_all()
        .and_then(|t| t.to_dtype(candle_core::DType::F32))
        .and_then(|t| t.to_vec1::<f32>())
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn carry_bits(carry: &TargetCarry) -> Vec<u32> {
    let mut out = bits(&carry.hidden);
    if let Some(kv) = &carry.shared_kv {
        out.extend(bits(&kv.full.keys));
        out.extend(bits(&kv.full.values));
        if let Some(sliding) = &kv.sliding {
            out.extend(bits(&sliding.keys));
            out.extend(bits(&sliding.values));
            out.push(sliding.start as u32);
        }
    }
    out
}

/// Drafts for a block: the reference's continuation where known, every third one wrong, so
/// rounds accept some drafts and reject others.
fn drafts(reference: &[u32], from: usize, count: usize, vocab: u32) -> Vec<u32> {
    (0..count)
        .map(|i| {
            let right = reference.get(from + i).copied().unwrap_or(1);
            if (from + i) % 3 == 2 {
                (right + 7) % vocab
            } else {
                right
            }
        })
        .collect()
}

/// Runs one turn: prefill `prompt`, then rounds of `block` tokens (the bonus and drafts
/// from `reference`) until `max` tokens, then releases the sequence.
#[allow(clippy::too_many_arguments)]
async fn turn<V: Verifier<Carry = TargetCarry>>(
    verifier: &V,
    seq: u64,
    prompt: &[u32],
    sampling: SamplingParams,
    scope: &str,
    block: usize,
    max: usize,
    reference: &[u32],
    vocab: u32,
) -> Turn {
    let seq = SeqId(seq);
    let request = core_prefill(
        seq.0,
        prompt.to_vec(),
        sampling,
        true,
        CacheScope(scope.into()),
    );
    let prefilled = verifier.prefill(request).await.unwrap();
    let carry = prefilled.carry.expect("a carry was asked for");
    let mut tokens = vec![prefilled.first_token];
    let mut round = 0;
    while tokens.len() < max {
        let room = max - tokens.len();
        let count = (block - 1).min(room.saturating_sub(1));
        let mut blocked = vec![*tokens.last().unwrap()];
        blocked.extend(drafts(reference, tokens.len(), count, vocab));
        let request = round_request(seq.0, round, blocked, tokens.len(), room);
        let verified = verifier.verify(request).await.unwrap();
        tokens.extend(verified.new_tokens);
        round += 1;
    }
    verifier.release(seq).await.unwrap();
    Turn {
        tokens,
        prefill_bits: carry_bits(&carry),
        cached: prefilled.cached_tokens,
    }
}

/// Three turns of a chat: each prompt is the last one, its answer and a new message.
fn next_prompt(prompt: &[u32], answer: &[u32], turn: usize, vocab: u32) -> Vec<u32> {
    let mut next = prompt.to_vec();
    next.extend_from_slice(answer);
    next.extend((0..9).map(|i| (31 * turn as u32 + 7 * i + 3) % vocab));
    next
}

fn system_prompt(len: usize, vocab: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 13 + 5) % vocab).collect()
}

/// The conversation on `cold` (no prefix cache) and `warm`, compared turn by turn; returns
/// the prompt tokens the warm turns took from the cache.
async fn conversation<V: Verifier<Carry = TargetCarry>>(
    cold: &V,
    warm: &V,
    sampling: SamplingParams,
    block: usize,
    vocab: u32,
) -> Vec<usize> {
    let mut prompt = system_prompt(37, vocab);
    let mut cached = Vec::new();
    for t in 0..3 {
        let seq = 100 * block as u64 + t as u64;
        let reference = turn(cold, seq, &prompt, sampling, "", 1, 12, &[], vocab).await;
        let got = turn(
            warm,
            seq,
            &prompt,
            sampling,
            "",
            block,
            12,
            &reference.tokens,
            vocab,
        )
        .await;
        assert_eq!(got.tokens, reference.tokens, "turn {t}, block {block}");
        assert_eq!(
            got.prefill_bits, reference.prefill_bits,
            "turn {t}, block {block}: prefill state differs"
        );
        assert_eq!(reference.cached, 0);
        cached.push(got.cached);
        prompt = next_prompt(&prompt, &got.tokens, t, vocab);
    }
    cached
}

fn qwen2_target(file: &TempGguf) -> Arc<Qwen2Target> {
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    Arc::new(Qwen2Target::new(model, Vec::new()))
}

fn gemma4_target() -> Arc<Gemma4Target> {
    // Small prefill pieces, so short prompts already span several.
    Arc::new(target_with_chunk(8))
}

fn verifiers<T: TargetModel>(
    target: Arc<T>,
    cache_bytes: usize,
) -> (LocalVerifier<T>, LocalVerifier<T>) {
    let limits = VerifierLimits::default();
    (
        LocalVerifier::new(target.clone(), limits).with_prefix_cache(0),
        LocalVerifier::new(target, limits).with_prefix_cache(cache_bytes),
    )
}

#[tokio::test]
async fn qwen2_cached_turns_equal_cold_ones() {
    let file = TempGguf::tiny("prefix-cache", &TinySpec::default());
    let target = qwen2_target(&file);
    for sampling in [GREEDY, SEEDED] {
        for block in 1..=8 {
            let (cold, warm) = verifiers(target.clone(), 64 << 20);
            let cached = conversation(&cold, &warm, sampling, block, 256).await;
            // Every later turn starts from the whole previous conversation but the last
            // answer token, which the cache never held.
            assert_eq!(cached[0], 0);
            assert_eq!(cached[1], 37 + 11, "block {block}");
            assert_eq!(cached[2], 37 + 12 + 9 + 11, "block {block}");
            let totals = warm.prefix_cache().counters().totals();
            assert_eq!(totals.lookups, 3);
            assert_eq!(totals.hit_tokens, (cached[1] + cached[2]) as u64);
            assert_eq!(warm.sequence_count(), 0);
            assert_eq!(warm.kv_reserved(), (0, 0));
        }
    }
}

#[tokio::test]
async fn gemma4_cached_turns_equal_cold_ones_in_whole_prefill_pieces() {
    let target = gemma4_target();
    for sampling in [GREEDY, SEEDED] {
        for block in [1, 3, 8] {
            let (cold, warm) = verifiers(target.clone(), 64 << 20);
            let cached = conversation(&cold, &warm, sampling, block, 256).await;
            // Only whole prefill pieces of an earlier prompt are reused: rows of answers
            // were computed by rounds, not by the prefill a cold run makes.
            assert_eq!(cached, vec![0, 32, 56], "block {block}");
        }
    }
}

#[tokio::test]
async fn gemma4_snapshot_taken_before_generation_survives_the_sliding_window() {
    // A sequence that generated far past its prompt no longer holds the sliding rows its
    // prompt's end needs; the boundary copy taken at prefill still does.
    let target = gemma4_target();
    let (cold, warm) = verifiers(target, 64 << 20);
    let prompt = system_prompt(40, 256);
    let first = turn(&warm, 1, &prompt, GREEDY, "", 1, 60, &[], 256).await;
    let mut next = prompt.clone();
    next.extend([9, 8, 7]);
    let reference = turn(&cold, 2, &next, GREEDY, "", 1, 8, &[], 256).await;
    let got = turn(&warm, 2, &next, GREEDY, "", 1, 8, &[], 256).await;
    assert_eq!(first.cached, 0);
    assert_eq!(got.cached, 40);
    assert_eq!(got.tokens, reference.tokens);
    assert_eq!(got.prefill_bits, reference.prefill_bits);
}

#[tokio::test]
async fn batched_verifier_reuses_prefixes_losslessly() {
    let file = TempGguf::tiny("prefix-cache-batch", &TinySpec::default());
    let target = qwen2_target(&file);
    let (cold, warm) = verifiers(target, 64 << 20);
    let cold = BatchVerifier::new(Arc::new(cold), BatchConfig::default());
    let warm = BatchVerifier::new(Arc::new(warm), BatchConfig::default());
    let cached = conversation(&cold, &warm, SEEDED, 4, 256).await;
    assert_eq!(cached, vec![0, 48, 69]);
    let gemma = gemma4_target();
    let (cold, warm) = verifiers(gemma, 64 << 20);
    let cold = BatchVerifier::new(Arc::new(cold), BatchConfig::default());
    let warm = BatchVerifier::new(Arc::new(warm), BatchConfig::default());
    let cached = conversation(&cold, &warm, GREEDY, 4, 256).await;
    assert_eq!(cached, vec![0, 32, 56]);
}

#[tokio::test]
async fn scopes_never_share_prefixes() {
    let file = TempGguf::tiny("prefix-cache-scope", &TinySpec::default());
    let (_, warm) = verifiers(qwen2_target(&file), 64 << 20);
    let prompt = system_prompt(30, 256);
    let mut longer = prompt.clone();
    longer.extend([1, 2, 3]);
    turn(&warm, 1, &prompt, GREEDY, "tenant-a", 1, 4, &[], 256).await;
    let other = turn(&warm, 2, &longer, GREEDY, "tenant-b", 1, 4, &[], 256).await;
    let open = turn(&warm, 3, &longer, GREEDY, "", 1, 4, &[], 256).await;
    let same = turn(&warm, 4, &longer, GREEDY, "tenant-a", 1, 4, &[], 256).await;
    assert_eq!((other.cached, open.cached), (0, 0));
    assert_eq!(same.cached, 30);
    assert_eq!(same.tokens, other.tokens);
}

#[tokio::test]
async fn a_running_sequence_seeds_one_that_shares_its_prompt() {
    let file = TempGguf::tiny("prefix-cache-live", &TinySpec::default());
    let (cold, warm) = verifiers(qwen2_target(&file), 64 << 20);
    let system = system_prompt(40, 256);
    let with = |tail: &[u32]| [system.as_slice(), tail].concat();
    let sampling = GREEDY;
    let request =
        |seq, prompt: Vec<u32>| core_prefill(seq, prompt, sampling, false, CacheScope::global());
    // The first request is still running when the second arrives.
    let a = warm.prefill_sync(request(1, with(&[1, 2]))).unwrap();
    let b = warm.prefill_sync(request(2, with(&[3, 4, 5]))).unwrap();
    assert_eq!((a.cached_tokens, b.cached_tokens), (0, 40));
    let cold_b = cold.prefill_sync(request(2, with(&[3, 4, 5]))).unwrap();
    assert_eq!(b.first_token, cold_b.first_token);
    // Both go on as they would alone.
    let mut tokens = [
        vec![a.first_token],
        vec![b.first_token],
        vec![cold_b.first_token],
    ];
    for round in 0..6 {
        for (i, (verifier, seq)) in [(&warm, 1), (&warm, 2), (&cold, 2)].into_iter().enumerate() {
            let verified = verifier
                .verify_sync(plain_round(seq, round, &tokens[i]))
                .unwrap();
            tokens[i].extend(verified.new_tokens);
        }
    }
    assert_eq!(tokens[1], tokens[2]);
    for seq in [1, 2] {
        warm.release_sync(SeqId(seq));
    }
}

#[tokio::test]
async fn a_small_cache_evicts_the_oldest_and_never_reuses_wrongly() {
    let file = TempGguf::tiny("prefix-cache-evict", &TinySpec::default());
    let target = qwen2_target(&file);
    // Room for about two finished conversations' K/V.
    let one = target.kv_bytes_bound(256);
    let (cold, warm) = verifiers(target.clone(), 2 * one + one / 2);
    let mut prompts: Vec<Vec<u32>> = (0..6)
        .map(|c| (0..30).map(|i| (i * 7 + 11 * c + 1) % 256).collect())
        .collect();
    for round in 0..3 {
        for (c, prompt) in prompts.iter_mut().enumerate() {
            let seq = (round * 10 + c) as u64;
            let reference = turn(&cold, seq, prompt, SEEDED, "", 1, 6, &[], 256).await;
            let got = turn(&warm, seq, prompt, SEEDED, "", 3, 6, &reference.tokens, 256).await;
            assert_eq!(
                got.tokens, reference.tokens,
                "conversation {c}, turn {round}"
            );
            assert_eq!(got.prefill_bits, reference.prefill_bits);
            let (held, _) = warm.prefix_cache().held();
            assert!(held <= 2 * one + one / 2, "{held}");
            *prompt = next_prompt(prompt, &got.tokens, round, 256);
        }
    }
    let totals = warm.prefix_cache().counters().totals();
    assert!(totals.evictions > 0, "{totals:?}");
    assert_eq!(warm.sequence_count(), 0);
    assert_eq!(warm.kv_reserved(), (0, 0));
    warm.prefix_cache().clear();
    assert_eq!(warm.prefix_cache().held(), (0, 0));
}

#[tokio::test]
async fn cached_prefixes_give_way_to_admission() {
    let file = TempGguf::tiny("prefix-cache-budget", &TinySpec::default());
    let target = qwen2_target(&file);
    // The budget admits one sequence of the whole context at a time.
    let whole = target.kv_bytes_bound(target.max_context());
    let warm = LocalVerifier::new(target.clone(), VerifierLimits::default())
        .with_kv_budget(KvBudget {
            max_tokens: None,
            max_bytes: Some(whole),
        })
        .with_prefix_cache(whole);
    for seq in 0..4u64 {
        let prompt: Vec<u32> = (0..40).map(|i| (i * 3 + seq as u32 * 17) % 256).collect();
        let prefilled = warm
            .prefill_sync_with_budget(
                core_prefill(seq, prompt, GREEDY, false, CacheScope::global()),
                None,
            )
            .unwrap();
        assert_eq!(prefilled.cached_tokens, 0);
        warm.release_sync(SeqId(seq));
        // What the cache keeps stays inside the budget beside what sequences reserve.
        let (held, _) = warm.prefix_cache().held();
        assert!(held + warm.kv_reserved().1 <= whole);
    }
    assert!(warm.prefix_cache().counters().totals().evictions >= 3);
}
