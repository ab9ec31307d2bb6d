//! The drafter's shared-K/V mirror kept up to date by per-round deltas equals a mirror built
//! from a fresh snapshot, through real greedy speculative rounds on the target (verify block,
//! acceptance, rollback), also after the sliding window has moved on.

use crate::common::{fixture_dir, reference, u32s};
use candle_core::{DType, Device, Tensor};
use specd_models::gemma4::{Gemma4Model, LayerKv, SharedKv, DEFAULT_PREFILL_CHUNK};
use specd_models::gemma4_assistant::{first_argmax, Gemma4Assistant, SharedKvMirror};

fn load(assistant: &str) -> (Gemma4Model, Gemma4Assistant) {
    let target_dir = fixture_dir("target-full");
    (
        Gemma4Model::load(&target_dir, DType::F32, &Device::Cpu).unwrap(),
        Gemma4Assistant::load(
            &fixture_dir(assistant),
            &target_dir,
            DType::F32,
            &Device::Cpu,
        )
        .unwrap(),
    )
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

fn same_rows(a: &LayerKv, b: &LayerKv, what: &str) {
    assert_eq!(a.start, b.start, "{what}: first position");
    assert_eq!(a.keys.dims(), b.keys.dims(), "{what}: shape");
    assert_eq!(values(&a.keys), values(&b.keys), "{what}: keys");
    assert_eq!(values(&a.values), values(&b.values), "{what}: values");
}

fn same_mirrors(a: &SharedKvMirror, b: &SharedKvMirror, round: usize) {
    assert_eq!(a.committed_len(), b.committed_len(), "round {round}");
    same_rows(
        &a.full().unwrap(),
        &b.full().unwrap(),
        &format!("round {round} full"),
    );
    same_rows(
        &a.sliding().unwrap().unwrap(),
        &b.sliding().unwrap().unwrap(),
        &format!("round {round} sliding"),
    );
}

fn target_argmax(target: &Gemma4Model, hidden: &Tensor) -> Vec<u32> {
    let logits = target.logits(hidden).unwrap().to_vec2::<f32>().unwrap();
    logits
        .iter()
        .map(|row| first_argmax(row).unwrap())
        .collect()
}

/// Greedy speculative decoding of `prompt` for `tokens` tokens, the mirror following the target
/// through deltas. Every few rounds the drafts are replaced by the target's own continuation
/// (from `oracle`) so that rounds accept several tokens and deltas carry several rows.
fn run_rounds(assistant_name: &str, prompt: &[u32], oracle: &[u32], tokens: usize) -> Vec<u32> {
    let (target, assistant) = load(assistant_name);
    let mut cache = target.new_cache(16);
    let mut hidden = target
        .prefill(&mut cache, prompt, DEFAULT_PREFILL_CHUNK)
        .unwrap();
    let mut bonus = target_argmax(&target, &hidden)[0];
    let mut mirror = assistant
        .new_mirror(&target.shared_kv(&cache, 0, cache.len()).unwrap())
        .unwrap();
    let mut emitted = vec![bonus];
    let mut round = 0;
    while emitted.len() < tokens {
        let k = 1 + round % 7;
        let mut drafts = assistant.draft_greedy(&mirror, bonus, &hidden, k).unwrap();
        if round % 3 == 2 {
            // Take the target's continuation for the first `round % 5` drafts.
            let known = &oracle[emitted.len()..];
            for (i, d) in drafts.iter_mut().enumerate().take(round % 5) {
                *d = known[i];
            }
        }
        let block: Vec<u32> = std::iter::once(bonus)
            .chain(drafts.iter().copied())
            .collect();
        let start = cache.len();
        let block_hidden = target.forward_block(&mut cache, &block).unwrap();
        let chosen = target_argmax(&target, &block_hidden);
        let accepted = drafts
            .iter()
            .zip(&chosen)
            .take_while(|(d, t)| d == t)
            .count();
        emitted.extend_from_slice(&drafts[..accepted]);
        emitted.push(chosen[accepted]);
        let end = start + accepted + 1;
        cache.truncate(end).unwrap();
        mirror
            .apply_delta(&target.shared_kv(&cache, start, end).unwrap())
            .unwrap();
        hidden = block_hidden.narrow(0, accepted, 1).unwrap();
        bonus = chosen[accepted];

        let fresh = assistant
            .new_mirror(&target.shared_kv(&cache, 0, cache.len()).unwrap())
            .unwrap();
        same_mirrors(&mirror, &fresh, round);
        let from_deltas = assistant.draft_greedy(&mirror, bonus, &hidden, 7).unwrap();
        let from_snapshot = assistant.draft_greedy(&fresh, bonus, &hidden, 7).unwrap();
        assert_eq!(from_deltas, from_snapshot, "round {round}: drafts");
        let a = assistant.step(&mirror, bonus, &hidden).unwrap();
        let b = assistant.step(&fresh, bonus, &hidden).unwrap();
        assert_eq!(
            values(&a.hidden),
            values(&b.hidden),
            "round {round}: step hidden bit for bit"
        );
        round += 1;
    }
    emitted.truncate(tokens);
    emitted
}

#[test]
fn mirror_from_deltas_equals_mirror_from_a_fresh_snapshot() {
    let target_reference = reference("target-full");
    for prompt in target_reference["prompts"].as_array().unwrap() {
        let greedy = u32s(&prompt["greedy"]);
        for assistant in ["assistant-dense", "assistant-centroid"] {
            let emitted = run_rounds(assistant, &u32s(&prompt["prompt_ids"]), &greedy, 40);
            // The output is the target's alone: speculation changes nothing.
            assert_eq!(emitted, greedy[..40], "{assistant} {}", prompt["name"]);
        }
    }
}

#[test]
fn mirror_keeps_every_full_row_and_the_visible_sliding_rows() {
    let (target, assistant) = load("assistant-dense");
    let prompt = u32s(&reference("target-full")["prompts"][2]["prompt_ids"]);
    let mut cache = target.new_cache(16);
    target
        .prefill(&mut cache, &prompt[..3], DEFAULT_PREFILL_CHUNK)
        .unwrap();
    let mut mirror = assistant
        .new_mirror(&target.shared_kv(&cache, 0, 3).unwrap())
        .unwrap();
    let keep = assistant.config().sliding_keys_visible();
    for &token in &prompt[3..] {
        let start = cache.len();
        target.forward_block(&mut cache, &[token]).unwrap();
        mirror
            .apply_delta(&target.shared_kv(&cache, start, start + 1).unwrap())
            .unwrap();
        let len = cache.len();
        assert_eq!(mirror.committed_len(), len);
        assert_eq!(
            (mirror.full().unwrap().start, mirror.full().unwrap().rows()),
            (0, len)
        );
        let sliding = mirror.sliding().unwrap().unwrap();
        assert_eq!(
            (sliding.start, sliding.end()),
            (len.saturating_sub(keep), len)
        );
    }
    // Compaction bounds the sliding buffer: what is held stays O(window), not O(context).
    let full_row_bytes = 2 * 32 * 4;
    let sliding_row_bytes = 2 * 2 * 16 * 4;
    let full_capacity = (2 * prompt.len()).max(16);
    assert!(mirror.bytes() <= full_capacity * full_row_bytes + (2 * keep + 1) * sliding_row_bytes);
}

#[test]
fn deltas_that_do_not_continue_the_mirror_are_refused() {
    let (target, assistant) = load("assistant-dense");
    let prompt = u32s(&reference("target-full")["prompts"][1]["prompt_ids"]);
    let mut cache = target.new_cache(16);
    target
        .prefill(&mut cache, &prompt, DEFAULT_PREFILL_CHUNK)
        .unwrap();
    let len = cache.len();
    let mut mirror = assistant
        .new_mirror(&target.shared_kv(&cache, 0, len).unwrap())
        .unwrap();

    // Rows the mirror already has.
    let stale = target.shared_kv(&cache, len - 1, len).unwrap();
    let err = mirror.apply_delta(&stale).unwrap_err().to_string();
    assert!(
        err.contains("delta.full.start") && err.contains(&len.to_string()),
        "{err}"
    );

    // Full and sliding rows of different lengths.
    target.forward_block(&mut cache, &[5, 6]).unwrap();
    let two = target.shared_kv(&cache, len, len + 2).unwrap();
    let one = target.shared_kv(&cache, len, len + 1).unwrap();
    let mixed = SharedKv {
        full: two.full.clone(),
        sliding: one.sliding.clone(),
    };
    let err = mirror.apply_delta(&mixed).unwrap_err().to_string();
    assert!(err.contains("delta.sliding"), "{err}");

    // A missing sliding part.
    let err = mirror
        .apply_delta(&SharedKv {
            full: two.full.clone(),
            sliding: None,
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("delta.sliding: missing"), "{err}");

    // Nothing was applied by the refused deltas.
    assert_eq!(mirror.committed_len(), len);
    mirror.apply_delta(&two).unwrap();
    assert_eq!(mirror.committed_len(), len + 2);

    // A snapshot that does not reach back far enough for the sliding window is refused.
    let snapshot = target.shared_kv(&cache, 0, cache.len()).unwrap();
    let sliding = snapshot.sliding.as_ref().unwrap();
    let short = SharedKv {
        full: snapshot.full.clone(),
        sliding: Some(sliding.range(cache.len() - 3, cache.len()).unwrap()),
    };
    let err = assistant.new_mirror(&short).err().unwrap().to_string();
    assert!(err.contains("snapshot.sliding.start"), "{err}");
}
