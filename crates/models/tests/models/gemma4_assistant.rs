//! The Gemma 4 assistant drafter against transformers: after a real target prefill, every
//! draft step's hidden states and logits and the drafted tokens equal the references, for the
//! dense head, the centroid head and a target without per-layer embeddings.

use crate::common::{f32s, fixture_dir, max_abs_diff, reference, u32s};
use candle_core::{DType, Device, Tensor};
use serde_json::Value;
use specd_models::gemma4::{Gemma4Model, SequenceCache, DEFAULT_PREFILL_CHUNK};
use specd_models::gemma4_assistant::{
    first_argmax, CentroidSelection, Gemma4Assistant, SharedKvMirror,
};

const ASSISTANTS: [&str; 4] = [
    "assistant-dense",
    "assistant-centroid",
    "assistant-nople",
    "assistant-moe",
];
const TOLERANCE: f32 = 1e-4;

struct Pair {
    target: Gemma4Model,
    assistant: Gemma4Assistant,
    reference: Value,
}

fn pair(assistant: &str) -> Pair {
    let reference = reference(assistant);
    let target_dir = fixture_dir(reference["target"].as_str().unwrap());
    Pair {
        target: Gemma4Model::load(&target_dir, DType::F32, &Device::Cpu).unwrap(),
        assistant: Gemma4Assistant::load(
            &fixture_dir(assistant),
            &target_dir,
            DType::F32,
            &Device::Cpu,
        )
        .unwrap(),
        reference,
    }
}

/// The state a drafter starts from after the target prefilled `prompt`.
struct Prefilled {
    cache: SequenceCache,
    hidden: Tensor,
    first_token: u32,
    mirror: SharedKvMirror,
}

fn prefill(pair: &Pair, prompt: &[u32]) -> Prefilled {
    let mut cache = pair.target.new_cache(16);
    let hidden = pair
        .target
        .prefill(&mut cache, prompt, DEFAULT_PREFILL_CHUNK)
        .unwrap();
    let logits = vec1(&pair.target.logits(&hidden).unwrap());
    let first_token = first_argmax(&logits).unwrap();
    let snapshot = pair.target.shared_kv(&cache, 0, cache.len()).unwrap();
    let mirror = pair.assistant.new_mirror(&snapshot).unwrap();
    Prefilled {
        cache,
        hidden,
        first_token,
        mirror,
    }
}

fn vec1(t: &Tensor) -> Vec<f32> {
    t.flatten_all()
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn prompts(reference: &Value) -> &Vec<Value> {
    reference["prompts"].as_array().unwrap()
}

#[test]
fn prefill_state_matches_what_transformers_hands_the_assistant() {
    for name in ASSISTANTS {
        let pair = pair(name);
        for prompt in prompts(&pair.reference) {
            let ids = u32s(&prompt["prompt_ids"]);
            let state = prefill(&pair, &ids);
            assert_eq!(
                state.first_token as u64,
                prompt["first_token"].as_u64().unwrap(),
                "{name}"
            );
            assert_eq!(
                state.mirror.committed_len() - 1,
                prompt["position"].as_u64().unwrap() as usize
            );
            let diff = max_abs_diff(&vec1(&state.hidden), &f32s(&prompt["target_hidden_last"]));
            assert!(diff < TOLERANCE, "{name}: target hidden differs by {diff}");

            // The keys the assistant's masks admit: every committed position for full layers,
            // the last W + 1 for sliding layers.
            let len = ids.len();
            let full: Vec<u32> = (0..len as u32).collect();
            assert_eq!(
                u32s(&prompt["visible_keys"]["full_attention"]),
                full,
                "{name}"
            );
            let first = len.saturating_sub(pair.assistant.config().sliding_keys_visible());
            let sliding: Vec<u32> = (first as u32..len as u32).collect();
            assert_eq!(
                u32s(&prompt["visible_keys"]["sliding_attention"]),
                sliding,
                "{name}"
            );
            let held = state.mirror.sliding().unwrap().unwrap();
            assert_eq!(
                (held.start, held.end()),
                (first, len),
                "{name}: the mirror keeps exactly the visible rows"
            );
            assert_eq!(state.mirror.full().unwrap().rows(), len);
        }
    }
}

#[test]
fn every_draft_step_matches_transformers() {
    for name in ASSISTANTS {
        let pair = pair(name);
        for prompt in prompts(&pair.reference) {
            let label = format!("{name} {}", prompt["name"]);
            let state = prefill(&pair, &u32s(&prompt["prompt_ids"]));
            let drafts = u32s(&prompt["drafts"]);
            let (mut token, mut hidden) = (state.first_token, state.hidden.clone());
            for (k, &want) in drafts.iter().enumerate() {
                let step = pair.assistant.step(&state.mirror, token, &hidden).unwrap();
                let diff = max_abs_diff(&vec1(&step.normed), &f32s(&prompt["step_normed"][k]));
                assert!(
                    diff < TOLERANCE,
                    "{label} step {k}: normed hidden differs by {diff}"
                );
                let diff = max_abs_diff(&vec1(&step.hidden), &f32s(&prompt["step_hidden"][k]));
                assert!(
                    diff < TOLERANCE,
                    "{label} step {k}: projected hidden differs by {diff}"
                );
                let logits = pair.assistant.logits(&step.normed).unwrap();
                let diff = max_abs_diff(&logits, &f32s(&prompt["step_logits"][k]));
                assert!(
                    diff < TOLERANCE,
                    "{label} step {k}: logits differ by {diff}"
                );
                if let Some(selection) = pair.assistant.centroid_selection(&step.normed).unwrap() {
                    assert_eq!(
                        selection.token_ids,
                        u32s(&prompt["step_selected_ids"][k]),
                        "{label} step {k}"
                    );
                    assert_eq!(
                        selection.centroids,
                        u32s(&prompt["step_top_centroids"][k]),
                        "{label} step {k}"
                    );
                }
                token = pair.assistant.argmax(&step.normed).unwrap();
                assert_eq!(token, want, "{label} step {k}: drafted token");
                hidden = step.hidden;
            }
        }
    }
}

#[test]
fn draft_block_equals_the_reference_drafts() {
    for name in ASSISTANTS {
        let pair = pair(name);
        for prompt in prompts(&pair.reference) {
            let state = prefill(&pair, &u32s(&prompt["prompt_ids"]));
            let want = u32s(&prompt["drafts"]);
            let got = pair
                .assistant
                .draft_greedy(&state.mirror, state.first_token, &state.hidden, want.len())
                .unwrap();
            assert_eq!(got, want, "{name} {}", prompt["name"]);
            // A shorter block is a prefix of a longer one.
            let got = pair
                .assistant
                .draft_greedy(&state.mirror, state.first_token, &state.hidden, 3)
                .unwrap();
            assert_eq!(got, want[..3], "{name} {}", prompt["name"]);
            assert!(state.cache.len() == state.mirror.committed_len());
        }
    }
}

#[test]
fn sampled_drafting_hands_each_step_its_logits() {
    for name in ASSISTANTS {
        let pair = pair(name);
        let prompt = &prompts(&pair.reference)[1];
        let state = prefill(&pair, &u32s(&prompt["prompt_ids"]));
        let mut seen = Vec::new();
        let got = pair
            .assistant
            .draft_sampled(
                &state.mirror,
                state.first_token,
                &state.hidden,
                7,
                |logits, step| {
                    assert_eq!(logits.len(), pair.assistant.vocab_size());
                    let reference_logits = f32s(&prompt["step_logits"][step]);
                    assert!(
                        max_abs_diff(logits, &reference_logits) < TOLERANCE,
                        "{name} step {step}"
                    );
                    seen.push(step);
                    first_argmax(logits).unwrap()
                },
            )
            .unwrap();
        assert_eq!(
            got,
            u32s(&prompt["drafts"]),
            "{name}: drawing the argmax is greedy drafting"
        );
        assert_eq!(seen, (0..7).collect::<Vec<_>>());

        // The drawn token, not the argmax, is what the next step embeds.
        let runner_up = |logits: &[f32]| {
            let mut order: Vec<usize> = (0..logits.len()).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
            order[1] as u32
        };
        let drawn = pair
            .assistant
            .draft_sampled(
                &state.mirror,
                state.first_token,
                &state.hidden,
                3,
                |logits, _| runner_up(logits),
            )
            .unwrap();
        let (mut token, mut hidden, mut by_hand) =
            (state.first_token, state.hidden.clone(), Vec::new());
        for _ in 0..3 {
            let step = pair.assistant.step(&state.mirror, token, &hidden).unwrap();
            token = runner_up(&pair.assistant.logits(&step.normed).unwrap());
            hidden = step.hidden;
            by_hand.push(token);
        }
        assert_eq!(drawn, by_hand, "{name}");
        assert_ne!(drawn[0], got[0]);

        let err = pair
            .assistant
            .draft_sampled(
                &state.mirror,
                state.first_token,
                &state.hidden,
                3,
                |_, _| 1_000_000,
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("step 0") && err.contains("1000000"), "{err}");
    }
}

#[test]
fn centroid_fast_argmax_equals_the_argmax_of_its_full_sparse_logits() {
    let pair = pair("assistant-centroid");
    let mut checked = 0;
    for prompt in prompts(&pair.reference) {
        let state = prefill(&pair, &u32s(&prompt["prompt_ids"]));
        // Every token as the step input gives 256 distinct hidden states to compare on.
        for token in 0..pair.assistant.vocab_size() as u32 {
            let step = pair
                .assistant
                .step(&state.mirror, token, &state.hidden)
                .unwrap();
            let full = pair.assistant.logits(&step.normed).unwrap();
            let fast = pair.assistant.argmax(&step.normed).unwrap();
            assert_eq!(Some(fast), first_argmax(&full), "token {token}");
            let selection = pair
                .assistant
                .centroid_selection(&step.normed)
                .unwrap()
                .unwrap();
            assert_eq!(
                selection.token_ids.len(),
                4 * 16,
                "top-k clusters x tokens per cluster"
            );
            assert!(selection.token_ids.contains(&fast));
            checked += 1;
        }
    }
    assert_eq!(checked, 512);

    // On a tie both pick the lower id, whatever the clusters' order.
    let tie = CentroidSelection {
        centroids: vec![1, 0],
        token_ids: vec![9, 4, 7],
        logits: vec![2.0, 2.0, -1.0],
    };
    assert_eq!(tie.argmax(), Some(4));
    assert_eq!(first_argmax(&tie.full_logits(12)), Some(4));
    let full = tie.full_logits(12);
    assert_eq!(
        full[0], -2.0,
        "unscored tokens sit one below the smallest scored logit"
    );
    assert_eq!((full[9], full[7]), (2.0, -1.0));
}

/// Off the row-exact CPU f32 kernels (what GPUs and half precision take), the drafter runs
/// through candle's matmuls; in f64 that path must give the same numbers and tokens.
#[test]
fn matmul_path_matches_transformers_in_f64() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Gemma4Assistant>();
    assert_send_sync::<SharedKvMirror>();

    for name in ["assistant-dense", "assistant-centroid"] {
        let reference = reference(name);
        let target_dir = fixture_dir(reference["target"].as_str().unwrap());
        let pair = Pair {
            target: Gemma4Model::load(&target_dir, DType::F64, &Device::Cpu).unwrap(),
            assistant: Gemma4Assistant::load(
                &fixture_dir(name),
                &target_dir,
                DType::F64,
                &Device::Cpu,
            )
            .unwrap(),
            reference,
        };
        for prompt in prompts(&pair.reference) {
            let state = prefill(&pair, &u32s(&prompt["prompt_ids"]));
            assert_eq!(
                state.first_token as u64,
                prompt["first_token"].as_u64().unwrap()
            );
            let step = pair
                .assistant
                .step(&state.mirror, state.first_token, &state.hidden)
                .unwrap();
            let diff = max_abs_diff(
                &pair.assistant.logits(&step.normed).unwrap(),
                &f32s(&prompt["step_logits"][0]),
            );
            assert!(diff < TOLERANCE, "{name}: f64 logits differ by {diff}");
            let want = u32s(&prompt["drafts"]);
            let got = pair
                .assistant
                .draft_greedy(&state.mirror, state.first_token, &state.hidden, 7)
                .unwrap();
            assert_eq!(got, want, "{name} {}", prompt["name"]);
        }
    }
}

/// Half precision runs end to end; its logits stay near the f32 reference.
#[test]
fn bf16_drafting_runs_close_to_the_reference() {
    let reference = reference("assistant-dense");
    let target_dir = fixture_dir("target-full");
    let pair = Pair {
        target: Gemma4Model::load(&target_dir, DType::BF16, &Device::Cpu).unwrap(),
        assistant: Gemma4Assistant::load(
            &fixture_dir("assistant-dense"),
            &target_dir,
            DType::BF16,
            &Device::Cpu,
        )
        .unwrap(),
        reference,
    };
    let prompt = &prompts(&pair.reference)[0];
    let state = prefill(&pair, &u32s(&prompt["prompt_ids"]));
    let first = u32::try_from(prompt["first_token"].as_u64().unwrap()).unwrap();
    let step = pair
        .assistant
        .step(&state.mirror, first, &state.hidden)
        .unwrap();
    assert_eq!(step.hidden.dtype(), DType::BF16);
    let diff = max_abs_diff(
        &pair.assistant.logits(&step.normed).unwrap(),
        &f32s(&prompt["step_logits"][0]),
    );
    assert!(diff < 0.1, "bf16 logits differ by {diff}");
    let drafts = pair
        .assistant
        .draft_greedy(&state.mirror, first, &state.hidden, 7)
        .unwrap();
    assert_eq!(drafts.len(), 7);
}
