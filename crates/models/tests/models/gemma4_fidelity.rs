//! The Gemma 4 text model against Hugging Face transformers' own outputs on tiny random
//! checkpoints (tools/gemma4_fixtures.py).

use crate::common::{argmax, f32s, fixture_dir, max_abs_diff, reference, u32s};
use candle_core::{DType, Device, Tensor};
use specd_models::gemma4::{Gemma4Model, DEFAULT_PREFILL_CHUNK};

const TARGETS: [&str; 5] = [
    "target-full",
    "target-nople",
    "target-multimodal",
    "target-sharded-bf16",
    "target-moe",
];
const LOGIT_TOLERANCE: f32 = 1e-4;

fn load(name: &str) -> Gemma4Model {
    Gemma4Model::load(&fixture_dir(name), DType::F32, &Device::Cpu).unwrap()
}

fn row(t: &Tensor, i: usize) -> Vec<f32> {
    t.get(i).unwrap().to_vec1::<f32>().unwrap()
}

#[test]
fn last_position_logits_match_transformers() {
    for name in TARGETS {
        let model = load(name);
        let reference = reference(name);
        for prompt in reference["prompts"].as_array().unwrap() {
            let ids = u32s(&prompt["prompt_ids"]);
            let mut cache = model.new_cache(16);
            let hidden = model
                .prefill(&mut cache, &ids, DEFAULT_PREFILL_CHUNK)
                .unwrap();
            let ours = row(&hidden, 0);
            let want_hidden = f32s(&prompt["final_hidden_last"]);
            let logits = row(&model.logits(&hidden).unwrap(), 0);
            let diff = max_abs_diff(&logits, &f32s(&prompt["last_logits"]));
            assert!(
                diff < LOGIT_TOLERANCE,
                "{name} {}: logits differ by {diff} (hidden differs by {})",
                prompt["name"],
                max_abs_diff(&ours, &want_hidden)
            );
        }
    }
}

#[test]
fn every_prompt_position_matches_transformers() {
    for name in TARGETS {
        let model = load(name);
        let reference = reference(name);
        let prompt = reference["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p.get("all_logits").is_some())
            .unwrap();
        let ids = u32s(&prompt["prompt_ids"]);
        let mut cache = model.new_cache(16);
        let hidden = model.forward_block(&mut cache, &ids).unwrap();
        let logits = model.logits(&hidden).unwrap();
        for (pos, want) in prompt["all_logits"].as_array().unwrap().iter().enumerate() {
            let diff = max_abs_diff(&row(&logits, pos), &f32s(want));
            assert!(
                diff < LOGIT_TOLERANCE,
                "{name} position {pos}: logits differ by {diff}"
            );
        }
    }
}

#[test]
fn greedy_continuations_match_transformers() {
    for name in TARGETS {
        let model = load(name);
        let reference = reference(name);
        for prompt in reference["prompts"].as_array().unwrap() {
            let ids = u32s(&prompt["prompt_ids"]);
            let want = u32s(&prompt["greedy"]);
            assert!(want.len() >= 64);
            let mut cache = model.new_cache(16);
            let hidden = model
                .prefill(&mut cache, &ids, DEFAULT_PREFILL_CHUNK)
                .unwrap();
            let mut next = argmax(&row(&model.logits(&hidden).unwrap(), 0));
            let mut got = vec![next];
            while got.len() < want.len() {
                let hidden = model.forward_block(&mut cache, &[next]).unwrap();
                next = argmax(&row(&model.logits(&hidden).unwrap(), 0));
                got.push(next);
            }
            assert_eq!(
                got, want,
                "{name} {}: greedy continuation differs",
                prompt["name"]
            );
        }
    }
}

#[test]
fn chunked_prefill_matches_one_forward() {
    let model = load("target-full");
    let reference = reference("target-full");
    let long = &reference["prompts"].as_array().unwrap()[2];
    let ids = u32s(&long["prompt_ids"]);
    for chunk in [1, 3, 5, 8, 100] {
        let mut cache = model.new_cache(16);
        let hidden = model.prefill(&mut cache, &ids, chunk).unwrap();
        let diff = max_abs_diff(
            &row(&model.logits(&hidden).unwrap(), 0),
            &f32s(&long["last_logits"]),
        );
        assert!(
            diff < LOGIT_TOLERANCE,
            "chunk {chunk}: logits differ by {diff}"
        );
        assert_eq!(cache.len(), ids.len());
    }
}
