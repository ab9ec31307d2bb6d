//! Properties the speculative round loop relies on: verifying a block equals decoding its
//! tokens one by one, rollback equals never having gone ahead (also after the sliding window
//! wrapped), and a batched forward equals each row alone. On CPU f32 these hold bit for bit.

use crate::common::gemma4::{prefilled, prompts, rows, tokens};
use crate::common::{fixture_dir, reference, u32s};
use candle_core::{DType, Device};
use specd_models::gemma4::{BlockInput, Gemma4Model, OutputRows, SequenceCache};

fn load(name: &str) -> Gemma4Model {
    Gemma4Model::load(&fixture_dir(name), DType::F32, &Device::Cpu).unwrap()
}

#[test]
fn block_forward_equals_one_token_steps_bit_for_bit() {
    for name in [
        "target-full",
        "target-nople",
        "target-multimodal",
        "target-moe",
    ] {
        let model = load(name);
        let vocab = model.config().vocab_size;
        for prompt in prompts(name) {
            for bs in [1, 2, 4, 8, 16] {
                let block = tokens(bs as u32 + prompt.len() as u32, bs, vocab);
                let mut block_cache = prefilled(&model, &prompt);
                let block_hidden = rows(&model.forward_block(&mut block_cache, &block).unwrap());
                let mut step_cache = prefilled(&model, &prompt);
                for (i, &t) in block.iter().enumerate() {
                    let step_hidden = rows(&model.forward_block(&mut step_cache, &[t]).unwrap());
                    assert_eq!(
                        step_hidden[0], block_hidden[i],
                        "{name} bs {bs}: position {i} differs"
                    );
                }
                let block_logits = rows(
                    &model
                        .logits(&model.forward_block(&mut block_cache, &[5]).unwrap())
                        .unwrap(),
                );
                let step_logits = rows(
                    &model
                        .logits(&model.forward_block(&mut step_cache, &[5]).unwrap())
                        .unwrap(),
                );
                assert_eq!(
                    block_logits, step_logits,
                    "{name} bs {bs}: the next step differs"
                );
            }
        }
    }
}

#[test]
fn rollback_equals_never_having_gone_ahead_across_the_window_wrap() {
    let model = load("target-full");
    let window = model.config().sliding_window;
    let vocab = model.config().vocab_size;
    let prompt = &prompts("target-full")[2];
    assert!(
        prompt.len() > window,
        "the long prompt must wrap the sliding window"
    );
    let real = tokens(7, 40, vocab);
    let mut clean = prefilled(&model, prompt);
    let mut rolled = prefilled(&model, prompt);
    let mut i = 0;
    let mut round = 0;
    while i < real.len() {
        // Go ahead with a rejected block of up to 16 tokens, roll back, then commit one real token.
        let rejected = tokens(100 + round, 1 + (round as usize * 5) % 16, vocab);
        let before = rolled.len();
        model.forward_block(&mut rolled, &rejected).unwrap();
        rolled.truncate(before).unwrap();
        let a = rows(&model.forward_block(&mut clean, &real[i..i + 1]).unwrap());
        let b = rows(&model.forward_block(&mut rolled, &real[i..i + 1]).unwrap());
        assert_eq!(
            a,
            b,
            "token {i} after a rollback of {} differs",
            rejected.len()
        );
        assert_eq!(clean.len(), rolled.len());
        i += 1;
        round += 1;
    }
    assert!(clean.len() > 3 * window);
}

#[test]
fn accepted_prefix_of_a_block_then_rollback_matches_clean_decode() {
    let model = load("target-nople");
    let vocab = model.config().vocab_size;
    let prompt = &prompts("target-nople")[2];
    let block = tokens(3, 9, vocab);
    for keep in 1..=block.len() {
        let mut verified = prefilled(&model, prompt);
        let start = verified.len();
        model.forward_block(&mut verified, &block).unwrap();
        verified.truncate(start + keep).unwrap();
        let mut clean = prefilled(&model, prompt);
        model.forward_block(&mut clean, &block[..keep]).unwrap();
        let probe = [9u32, 10, 11];
        assert_eq!(
            rows(&model.forward_block(&mut verified, &probe).unwrap()),
            rows(&model.forward_block(&mut clean, &probe).unwrap()),
            "kept {keep} of {}",
            block.len()
        );
    }
}

#[test]
fn rollback_beyond_the_slack_after_a_wrap_is_refused() {
    let model = load("target-full");
    let prompt = &prompts("target-full")[2];
    let mut cache = prefilled(&model, prompt);
    model
        .forward_block(&mut cache, &tokens(1, 12, model.config().vocab_size))
        .unwrap();
    let err = cache.truncate(cache.len() - 17).unwrap_err().to_string();
    assert!(err.contains("roll back"), "{err}");
    // Within the slack it works.
    cache.truncate(cache.len() - 16).unwrap();
}

#[test]
fn batched_forward_equals_each_row_alone() {
    for name in ["target-full", "target-nople", "target-moe"] {
        let model = load(name);
        let vocab = model.config().vocab_size;
        let ps = prompts(name);
        let blocks: Vec<Vec<u32>> = [3usize, 1, 8]
            .iter()
            .enumerate()
            .map(|(i, &n)| tokens(i as u32 + 40, n, vocab))
            .collect();
        let mut batch_caches: Vec<SequenceCache> =
            ps.iter().map(|p| prefilled(&model, p)).collect();
        let batched = {
            let mut inputs: Vec<BlockInput<'_>> = batch_caches
                .iter_mut()
                .zip(&blocks)
                .map(|(cache, b)| BlockInput::chain(cache, b))
                .collect();
            model.forward(&mut inputs, OutputRows::All).unwrap()
        };
        for (r, p) in ps.iter().enumerate() {
            let mut alone = prefilled(&model, p);
            let solo = rows(&model.forward_block(&mut alone, &blocks[r]).unwrap());
            assert_eq!(
                rows(&batched[r]),
                solo,
                "{name} row {r} differs from the row alone"
            );
            assert_eq!(alone.len(), batch_caches[r].len());
        }
        // The caches a batch leaves behind are the caches each row leaves alone.
        for (r, p) in ps.iter().enumerate() {
            let mut alone = prefilled(&model, p);
            model.forward_block(&mut alone, &blocks[r]).unwrap();
            let next = [4u32, 5];
            assert_eq!(
                rows(&model.forward_block(&mut batch_caches[r], &next).unwrap()),
                rows(&model.forward_block(&mut alone, &next).unwrap())
            );
        }
    }
}

#[test]
fn shared_kv_matches_what_transformers_hands_the_assistant() {
    let model = load("target-full");
    let reference = reference("assistant-dense");
    for prompt in reference["prompts"].as_array().unwrap() {
        let ids = u32s(&prompt["prompt_ids"]);
        let cache = prefilled(&model, &ids);
        let kv = model.shared_kv(&cache, 0, cache.len()).unwrap();
        let full = &prompt["shared_kv"]["full_attention"];
        let got: Vec<f32> = kv.full.keys.flatten_all().unwrap().to_vec1().unwrap();
        let diff = crate::common::max_abs_diff(&got, &crate::common::f32s(&full["k"]));
        assert!(diff < 1e-5, "full K differs by {diff}");
        let got: Vec<f32> = kv.full.values.flatten_all().unwrap().to_vec1().unwrap();
        let diff = crate::common::max_abs_diff(&got, &crate::common::f32s(&full["v"]));
        assert!(diff < 1e-5, "full V differs by {diff}");
        let sliding = kv.sliding.as_ref().unwrap();
        let want_shape = u32s(&prompt["shared_kv"]["sliding_attention"]["shape"]);
        let rows_held = want_shape[2] as usize;
        // HF hands over the whole prompt for the sliding layer too; compare the rows we hold.
        let held = sliding.keys.dims()[1];
        let want_k = crate::common::f32s(&prompt["shared_kv"]["sliding_attention"]["k"]);
        let d = sliding.keys.dims()[2];
        let heads = sliding.keys.dims()[0];
        for h in 0..heads {
            for r in 0..held {
                let pos = sliding.start + r;
                let want = &want_k[(h * rows_held + pos) * d..(h * rows_held + pos + 1) * d];
                let got: Vec<f32> = sliding
                    .keys
                    .get(h)
                    .unwrap()
                    .get(r)
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                assert!(
                    crate::common::max_abs_diff(&got, want) < 1e-5,
                    "sliding K head {h} position {pos}"
                );
            }
        }
    }
}
