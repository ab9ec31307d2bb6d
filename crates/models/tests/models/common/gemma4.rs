//! What the Gemma 4 target tests share: a fixture's prompts, a prefilled cache, greedy
//! continuation, and pseudo-random token ids.

use candle_core::Tensor;
use specd_models::gemma4::{Gemma4Model, SequenceCache, DEFAULT_PREFILL_CHUNK};

use super::{argmax, reference, u32s};

pub fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_vec2::<f32>().unwrap()
}

/// The prompt ids of a fixture's references.
pub fn prompts(name: &str) -> Vec<Vec<u32>> {
    reference(name)["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| u32s(&p["prompt_ids"]))
        .collect()
}

pub fn prefilled(model: &Gemma4Model, prompt: &[u32]) -> SequenceCache {
    let mut cache = model.new_cache(16);
    model
        .prefill(&mut cache, prompt, DEFAULT_PREFILL_CHUNK)
        .unwrap();
    cache
}

/// `n` greedy tokens after `prompt`, one forward per token.
pub fn greedy_continuation(model: &Gemma4Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut cache = model.new_cache(16);
    let hidden = model
        .prefill(&mut cache, prompt, DEFAULT_PREFILL_CHUNK)
        .unwrap();
    let mut next = argmax(&rows(&model.logits(&hidden).unwrap())[0]);
    let mut got = vec![next];
    while got.len() < n {
        let hidden = model.forward_block(&mut cache, &[next]).unwrap();
        next = argmax(&rows(&model.logits(&hidden).unwrap())[0]);
        got.push(next);
    }
    got
}

/// Deterministic pseudo-random token ids in `[3, vocab)`.
pub fn tokens(seed: u32, n: usize, vocab: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            3 + x % (vocab as u32 - 3)
        })
        .collect()
}
