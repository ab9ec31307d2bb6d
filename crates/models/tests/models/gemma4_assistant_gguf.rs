//! Gemma 4 assistants from GGUF files written by llama.cpp's converter
//! (tools/gemma4_gguf_fixtures.sh): with a safetensors or a GGUF target, every draft step gives
//! the bits of the safetensors pair they were converted from, and so transformers' drafts; a
//! file that is not a runnable assistant is refused naming the key or tensor.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use specd_models::gemma4::{Gemma4Model, DEFAULT_PREFILL_CHUNK};
use specd_models::gemma4_assistant::{
    first_argmax, Gemma4Assistant, Gemma4AssistantConfig, TargetEmbedding,
};
use specd_models::ModelSource;

use crate::common::gguf_parts::Parts;
use crate::common::tempdir::TempDir;
use crate::common::{f32s, fixture_dir, max_abs_diff, reference, u32s};

/// The dense-head assistants and the targets they were trained with.
const PAIRS: [(&str, &str); 2] = [
    ("assistant-dense", "target-full"),
    ("assistant-moe", "target-moe"),
];
const TOLERANCE: f32 = 1e-4;

fn gguf_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gemma4-gguf")
        .join(format!("{name}-f32.gguf"))
}

fn load(assistant: &Path, target: &Path) -> Gemma4Assistant {
    Gemma4Assistant::load(assistant, target, DType::F32, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{} with {}: {e}", assistant.display(), target.display()))
}

fn load_error(assistant: &Path, target: &Path) -> String {
    match Gemma4Assistant::load(assistant, target, DType::F32, &Device::Cpu) {
        Ok(_) => panic!("{} loaded", assistant.display()),
        Err(e) => e.to_string(),
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

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every step of a greedy draft block after `target` prefilled `prompt`: (normed, hidden,
/// logits) per step, and the drafted tokens.
type Steps = (Vec<(Vec<f32>, Vec<f32>, Vec<f32>)>, Vec<u32>);

fn draft_steps(
    target: &Gemma4Model,
    assistant: &Gemma4Assistant,
    prompt: &[u32],
    n: usize,
) -> Steps {
    let mut cache = target.new_cache(16);
    let hidden = target
        .prefill(&mut cache, prompt, DEFAULT_PREFILL_CHUNK)
        .unwrap();
    let first = first_argmax(&vec1(&target.logits(&hidden).unwrap())).unwrap();
    let mirror = assistant
        .new_mirror(&target.shared_kv(&cache, 0, cache.len()).unwrap())
        .unwrap();
    let block = assistant.draft_greedy(&mirror, first, &hidden, n).unwrap();
    let (mut token, mut hidden) = (first, hidden);
    let mut steps = Vec::new();
    let mut drafts = Vec::new();
    for _ in 0..n {
        let step = assistant.step(&mirror, token, &hidden).unwrap();
        let logits = assistant.logits(&step.normed).unwrap();
        token = assistant.argmax(&step.normed).unwrap();
        drafts.push(token);
        steps.push((vec1(&step.normed), vec1(&step.hidden), logits));
        hidden = step.hidden;
    }
    assert_eq!(block, drafts, "a draft block is its steps");
    (steps, drafts)
}

#[test]
fn gguf_assistants_are_detected_as_assistants() {
    for (name, _) in PAIRS {
        let path = gguf_fixture(name);
        assert_eq!(
            ModelSource::detect(&path).unwrap().family(),
            &specd_models::gemma4_assistant::FAMILY
        );
    }
}

#[test]
fn gguf_assistants_resolve_the_safetensors_configuration() {
    for (name, target) in PAIRS {
        let gguf = load(&gguf_fixture(name), &fixture_dir(target));
        let (g, s) = (
            gguf.config(),
            &Gemma4AssistantConfig::from_dir(&fixture_dir(name)).unwrap(),
        );
        // Values from keys is not recorded for an assistant, which computes no K/V.
        let geometry = |c: &Gemma4AssistantConfig| {
            c.text
                .layers
                .iter()
                .map(|l| {
                    (
                        l.kind,
                        l.head_dim,
                        l.num_kv_heads,
                        l.kv_source,
                        l.mlp_intermediate,
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(geometry(g), geometry(s), "{name}: layer geometry");
        assert_eq!(g.text.rope_sliding, s.text.rope_sliding, "{name}");
        assert_eq!(g.text.rope_full, s.text.rope_full, "{name}");
        let sizes = |c: &Gemma4AssistantConfig| {
            (
                c.text.vocab_size,
                c.text.hidden_size,
                c.text.intermediate_size,
                c.text.num_layers,
                c.text.num_heads,
                c.text.num_kv_shared_layers,
                c.text.sliding_window,
                c.text.attention_bias,
                c.backbone_hidden_size,
                c.use_ordered_embeddings,
                c.tie_word_embeddings,
                c.text.rms_norm_eps as f32,
            )
        };
        assert_eq!(sizes(g), sizes(s), "{name}: sizes and flags");
        // The checkpoint's suggested verify width has no GGUF key.
        assert_eq!(g.block_size, None);
    }
}

#[test]
fn gguf_assistants_draft_the_safetensors_bits_with_either_target() {
    for (name, target) in PAIRS {
        let st_target = Gemma4Model::load(&fixture_dir(target), DType::F32, &Device::Cpu).unwrap();
        let gguf_target =
            Gemma4Model::load(&gguf_fixture(target), DType::F32, &Device::Cpu).unwrap();
        let st = load(&fixture_dir(name), &fixture_dir(target));
        let reference = reference(name);
        for prompt in reference["prompts"].as_array().unwrap() {
            let ids = u32s(&prompt["prompt_ids"]);
            let want = u32s(&prompt["drafts"]);
            let (st_steps, st_drafts) = draft_steps(&st_target, &st, &ids, want.len());
            assert_eq!(st_drafts, want, "{name}: the safetensors pair");
            for (label, model, assistant_target) in [
                ("gguf assistant", &st_target, fixture_dir(target)),
                (
                    "gguf assistant and target",
                    &gguf_target,
                    gguf_fixture(target),
                ),
            ] {
                let label = format!("{name} {} {label}", prompt["name"]);
                let assistant = load(&gguf_fixture(name), &assistant_target);
                let (steps, drafts) = draft_steps(model, &assistant, &ids, want.len());
                assert_eq!(drafts, want, "{label}: drafts");
                for (k, (got, st)) in steps.iter().zip(&st_steps).enumerate() {
                    assert_eq!(bits(&got.0), bits(&st.0), "{label} step {k}: normed");
                    assert_eq!(bits(&got.1), bits(&st.1), "{label} step {k}: hidden");
                    assert_eq!(bits(&got.2), bits(&st.2), "{label} step {k}: logits");
                    let diff = max_abs_diff(&got.2, &f32s(&prompt["step_logits"][k]));
                    assert!(
                        diff < TOLERANCE,
                        "{label} step {k}: {diff} from transformers"
                    );
                    let diff = max_abs_diff(&got.1, &f32s(&prompt["step_hidden"][k]));
                    assert!(
                        diff < TOLERANCE,
                        "{label} step {k}: {diff} from transformers"
                    );
                }
            }
        }
    }
}

#[test]
fn half_precision_gguf_pairs_draft_close_to_f32() {
    let dir = TempDir::new("gemma4-assistant-gguf-half");
    let (name, target) = PAIRS[0];
    let prompt = &reference(name)["prompts"][0];
    let ids = u32s(&prompt["prompt_ids"]);
    let want = u32s(&prompt["drafts"]);
    let f32_target = Gemma4Model::load(&gguf_fixture(target), DType::F32, &Device::Cpu).unwrap();
    let f32_assistant = load(&gguf_fixture(name), &gguf_fixture(target));
    let (f32_steps, _) = draft_steps(&f32_target, &f32_assistant, &ids, want.len());
    // Bounds a few times the rounding seen on these weights.
    for (dtype, bound) in [(GgmlDType::F16, 0.01), (GgmlDType::BF16, 0.1)] {
        let write = |name: &str| {
            let mut parts = Parts::read(&gguf_fixture(name));
            parts.matrices_as(dtype);
            parts.write(&dir, &format!("{name}-{dtype:?}.gguf"))
        };
        let (assistant_path, target_path) = (write(name), write(target));
        let target_model = Gemma4Model::load(&target_path, DType::F32, &Device::Cpu).unwrap();
        let assistant = load(&assistant_path, &target_path);
        let (steps, drafts) = draft_steps(&target_model, &assistant, &ids, want.len());
        for (k, (got, f32_step)) in steps.iter().zip(&f32_steps).enumerate() {
            let diff = max_abs_diff(&got.2, &f32_step.2);
            assert!(diff < bound, "{dtype:?} step {k}: logits differ by {diff}");
        }
        if dtype == GgmlDType::F16 {
            assert_eq!(drafts, want, "{dtype:?}: drafts");
        }
    }
}

#[test]
fn q8_0_gguf_assistants_draft_close_to_their_own_weights_in_f32() {
    let dir = TempDir::new("gemma4-assistant-gguf-q8_0");
    for (name, target) in PAIRS {
        let prompt = &reference(name)["prompts"][0];
        let ids = u32s(&prompt["prompt_ids"]);
        let n = u32s(&prompt["drafts"]).len();
        // Every matrix whose rows are whole Q8_0 blocks, the tied head included; the same
        // weights dequantized back to F32 beside them.
        let mut parts = Parts::read(&gguf_fixture(name));
        let mut quantized = 0;
        for (_, t) in parts.tensors.iter_mut() {
            let dims = t.shape().dims().to_vec();
            if dims.len() == 2 && dims[1] % 32 == 0 {
                let dense = t.dequantize(&Device::Cpu).unwrap();
                *t = QTensor::quantize(&dense, GgmlDType::Q8_0).unwrap();
                quantized += 1;
            }
        }
        assert!(quantized >= 5, "{name}: {quantized} matrices quantized");
        let q8_path = parts.write(&dir, &format!("{name}-q8_0.gguf"));
        for (_, t) in parts.tensors.iter_mut() {
            let dense = t.dequantize(&Device::Cpu).unwrap();
            *t = QTensor::quantize(&dense, GgmlDType::F32).unwrap();
        }
        let f32_path = parts.write(&dir, &format!("{name}-q8_0-as-f32.gguf"));
        let target_model =
            Gemma4Model::load(&gguf_fixture(target), DType::F32, &Device::Cpu).unwrap();
        let (q8_steps, _) = draft_steps(
            &target_model,
            &load(&q8_path, &gguf_fixture(target)),
            &ids,
            n,
        );
        let (f32_steps, _) = draft_steps(
            &target_model,
            &load(&f32_path, &gguf_fixture(target)),
            &ids,
            n,
        );
        // The packed kernels quantize activations to 8 bits too: up to 0.045 (dense) and
        // 0.058 (MoE) here.
        for (k, (got, want)) in q8_steps.iter().zip(&f32_steps).enumerate() {
            let diff = max_abs_diff(&got.2, &want.2);
            assert!(diff < 0.1, "{name} step {k}: logits differ by {diff}");
        }
    }
}

#[test]
fn a_gguf_target_table_is_read_a_row_at_a_time_in_any_stored_type() {
    let dir = TempDir::new("gemma4-assistant-gguf-table");
    let target = "target-full";
    let model = Gemma4Model::load(&gguf_fixture(target), DType::F32, &Device::Cpu).unwrap();
    let (cfg, layout) = (model.config().clone(), model.layout().clone());
    let scale = (cfg.hidden_size as f64).sqrt() as f32 as f64;
    for dtype in [
        GgmlDType::F32,
        GgmlDType::F16,
        GgmlDType::BF16,
        GgmlDType::Q8_0,
    ] {
        let mut parts = Parts::read(&gguf_fixture(target));
        parts.tensor_as("token_embd.weight", dtype);
        let table: &QTensor = &parts
            .tensors
            .iter()
            .find(|(n, _)| n == "token_embd.weight")
            .unwrap()
            .1;
        let table = table.dequantize(&Device::Cpu).unwrap();
        let path = parts.write(&dir, &format!("{dtype:?}.gguf"));
        let embedding =
            TargetEmbedding::open(&path, &cfg, &layout, DType::F32, &Device::Cpu).unwrap();
        for token in [0u32, 1, 17, cfg.vocab_size as u32 - 1] {
            let want = (table.narrow(0, token as usize, 1).unwrap() * scale).unwrap();
            let got = embedding.embed(token).unwrap();
            assert_eq!(
                bits(&vec1(&got)),
                bits(&vec1(&want)),
                "{dtype:?}: token {token}"
            );
        }
        let err = embedding.embed(cfg.vocab_size as u32).unwrap_err();
        assert!(err.to_string().contains("vocabulary"), "{err}");
    }
}

#[test]
fn a_missing_tensor_or_key_is_named_as_the_file_names_it() {
    let dir = TempDir::new("gemma4-assistant-gguf-missing");
    let (name, target) = PAIRS[0];
    let target = fixture_dir(target);
    for tensor in [
        "nextn.pre_projection.weight",
        "nextn.post_projection.weight",
        "blk.2.attn_q.weight",
        "output_norm.weight",
    ] {
        let mut parts = Parts::read(&gguf_fixture(name));
        parts.tensors.retain(|(n, _)| n != tensor);
        let err = load_error(&parts.write(&dir, "missing.gguf"), &target);
        assert!(err.contains(tensor), "{tensor}: {err}");
        assert!(err.contains("missing"), "{tensor}: {err}");
    }
    for key in [
        "gemma4-assistant.embedding_length_out",
        "gemma4-assistant.nextn_predict_layers",
        "gemma4-assistant.attention.head_count_kv",
        "gemma4-assistant.attention.sliding_window",
    ] {
        let mut parts = Parts::read(&gguf_fixture(name));
        parts.metadata.remove(key);
        let err = load_error(&parts.write(&dir, "no-key.gguf"), &target);
        assert!(err.contains(key), "{key}: {err}");
    }
    // Layers that would compute their own K/V are not an assistant's.
    let mut parts = Parts::read(&gguf_fixture(name));
    parts.metadata.insert(
        "gemma4-assistant.attention.shared_kv_layers".into(),
        Value::U32(2),
    );
    let err = load_error(&parts.write(&dir, "unshared.gguf"), &target);
    assert!(
        err.contains("gemma4-assistant.attention.shared_kv_layers"),
        "{err}"
    );
}

#[test]
fn other_files_are_refused_as_assistants() {
    let dir = TempDir::new("gemma4-assistant-gguf-refused");
    let (name, target) = PAIRS[0];
    let target_dir = fixture_dir(target);

    // A target's file given as the assistant.
    let err = load_error(&gguf_fixture(target), &target_dir);
    assert!(err.contains("general.architecture"), "{err}");
    assert!(err.contains("gemma4-assistant"), "{err}");

    // A centroid head's tensors, which no key describes fully.
    let mut parts = Parts::read(&gguf_fixture(name));
    let centroids = Tensor::zeros((16, 32), DType::F32, &Device::Cpu).unwrap();
    parts.tensors.push((
        "masked_embd_centroids.weight".into(),
        QTensor::quantize(&centroids, GgmlDType::F32).unwrap(),
    ));
    let err = load_error(&parts.write(&dir, "centroid.gguf"), &target_dir);
    assert!(err.contains("masked_embd_centroids.weight"), "{err}");
    assert!(err.contains("centroid"), "{err}");

    // An assistant for another target: its backbone width names both sizes.
    let mut parts = Parts::read(&gguf_fixture(name));
    parts.metadata.insert(
        "gemma4-assistant.embedding_length_out".into(),
        Value::U32(48),
    );
    let err = load_error(&parts.write(&dir, "other-target.gguf"), &target_dir);
    assert!(err.contains("48") && err.contains("64"), "{err}");
}
