//! Gemma 4 targets from GGUF files written by llama.cpp's converter
//! (tools/gemma4_gguf_fixtures.sh): the same numbers as the safetensors checkpoints they were
//! converted from, and errors that name what is wrong with a file.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use specd_models::gemma4::{Gemma4Model, Gemma4TextConfig, DEFAULT_PREFILL_CHUNK};
use specd_models::ModelSource;

use crate::common::gemma4::{greedy_continuation, rows};
use crate::common::gguf_parts::Parts;
use crate::common::tempdir::TempDir;
use crate::common::{argmax, f32s, fixture_dir, max_abs_diff, reference, u32s};

const TARGETS: [&str; 3] = ["target-nople", "target-full", "target-moe"];

fn gguf_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gemma4-gguf")
        .join(format!("{name}-f32.gguf"))
}

fn load(path: &Path) -> Gemma4Model {
    Gemma4Model::load(path, DType::F32, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn assert_same_config(name: &str, gguf: &Gemma4TextConfig, st: &Gemma4TextConfig) {
    assert_eq!(gguf.layers, st.layers, "{name}: layer geometry");
    assert_eq!(gguf.rope_sliding, st.rope_sliding, "{name}: sliding RoPE");
    assert_eq!(gguf.rope_full, st.rope_full, "{name}: full RoPE");
    assert_eq!(gguf.moe, st.moe, "{name}: experts");
    let sizes = |c: &Gemma4TextConfig| {
        (
            c.vocab_size,
            c.hidden_size,
            c.num_layers,
            c.num_heads,
            c.sliding_window,
            c.per_layer_input_size,
            // Read only with per-layer embeddings.
            c.per_layer_input_size.map(|_| c.per_layer_vocab_size),
            c.num_kv_shared_layers,
            c.max_position_embeddings,
        )
    };
    assert_eq!(sizes(gguf), sizes(st), "{name}: sizes");
    let flags = |c: &Gemma4TextConfig| {
        (
            c.tie_word_embeddings,
            c.attention_bias,
            c.final_logit_softcapping,
            c.bos_token_id,
            c.eos_token_ids.clone(),
        )
    };
    assert_eq!(flags(gguf), flags(st), "{name}: flags and token ids");
    // GGUF stores the epsilon as f32, which is what the norms compute with.
    assert_eq!(
        gguf.rms_norm_eps as f32, st.rms_norm_eps as f32,
        "{name}: rms_norm_eps"
    );
}

#[test]
fn gguf_targets_are_detected_as_gemma4() {
    for name in TARGETS {
        let path = gguf_fixture(name);
        assert_eq!(
            ModelSource::detect(&path).unwrap().family(),
            &specd_models::gemma4::FAMILY
        );
    }
}

#[test]
fn gguf_targets_give_the_safetensors_logits_bit_for_bit() {
    for name in TARGETS {
        let gguf = load(&gguf_fixture(name));
        let st = load(&fixture_dir(name));
        assert_same_config(name, gguf.config(), st.config());
        for prompt in reference(name)["prompts"].as_array().unwrap() {
            let ids = u32s(&prompt["prompt_ids"]);
            let label = format!("{name} {}", prompt["name"]);

            let (mut a, mut b) = (gguf.new_cache(16), st.new_cache(16));
            let last_a = gguf.prefill(&mut a, &ids, DEFAULT_PREFILL_CHUNK).unwrap();
            let last_b = st.prefill(&mut b, &ids, DEFAULT_PREFILL_CHUNK).unwrap();
            let logits_a = rows(&gguf.logits(&last_a).unwrap());
            let logits_b = rows(&st.logits(&last_b).unwrap());
            assert_eq!(bits(&logits_a), bits(&logits_b), "{label}: last logits");
            let diff = max_abs_diff(&logits_a[0], &f32s(&prompt["last_logits"]));
            assert!(diff < 1e-4, "{label}: {diff} from transformers' logits");

            let (mut a, mut b) = (gguf.new_cache(16), st.new_cache(16));
            let all_a = rows(
                &gguf
                    .logits(&gguf.forward_block(&mut a, &ids).unwrap())
                    .unwrap(),
            );
            let all_b = rows(&st.logits(&st.forward_block(&mut b, &ids).unwrap()).unwrap());
            assert_eq!(bits(&all_a), bits(&all_b), "{label}: every position");
        }
    }
}

#[test]
fn gguf_targets_continue_greedily_like_transformers() {
    for name in TARGETS {
        let model = load(&gguf_fixture(name));
        for prompt in reference(name)["prompts"].as_array().unwrap() {
            let ids = u32s(&prompt["prompt_ids"]);
            let want = u32s(&prompt["greedy"]);
            let got = greedy_continuation(&model, &ids, want.len());
            assert_eq!(got, want, "{name} {}: greedy continuation", prompt["name"]);
        }
    }
}

fn load_error(path: &Path) -> String {
    match Gemma4Model::load(path, DType::F32, &Device::Cpu) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_tensor_is_named_by_its_gguf_name() {
    let dir = TempDir::new("gemma4-gguf-missing");
    let mut parts = Parts::read(&gguf_fixture("target-full"));
    parts.tensors.retain(|(n, _)| n != "blk.3.ffn_up.weight");
    let err = load_error(&parts.write(&dir, "missing.gguf"));
    assert!(err.contains("blk.3.ffn_up.weight"), "{err}");
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn another_architecture_is_refused_by_name() {
    let dir = TempDir::new("gemma4-gguf-arch");
    let mut parts = Parts::read(&gguf_fixture("target-nople"));
    parts
        .metadata
        .insert("general.architecture".into(), Value::String("llama".into()));
    let err = load_error(&parts.write(&dir, "llama.gguf"));
    assert!(err.contains("general.architecture"), "{err}");
    assert!(err.contains("\"llama\""), "{err}");
}

#[test]
fn missing_metadata_is_named_by_its_key() {
    let dir = TempDir::new("gemma4-gguf-meta");
    let mut parts = Parts::read(&gguf_fixture("target-nople"));
    parts.metadata.remove("gemma4.attention.sliding_window");
    let err = load_error(&parts.write(&dir, "no-window.gguf"));
    assert!(err.contains("gemma4.attention.sliding_window"), "{err}");
}

#[test]
fn quantized_types_without_cpu_kernels_are_refused_naming_the_tensor() {
    // Q8_0 and the other types the CPU engine runs load (gemma4_gguf_quantized.rs); Q4_1 has
    // no kernel.
    let dir = TempDir::new("gemma4-gguf-refused");
    for name in ["target-nople", "target-moe"] {
        let mut parts = Parts::read(&gguf_fixture(name));
        parts.matrices_as(GgmlDType::Q4_1);
        let err = load_error(&parts.write(&dir, &format!("{name}-q4_1.gguf")));
        assert!(err.contains("Q4_1"), "{name}: {err}");
        assert!(err.contains(".weight"), "{name}: {err}");
    }

    // The experts' 3-D weights are refused like the matrices (only the fused gate/up rows are
    // whole blocks of 32 in this tiny model).
    let mut parts = Parts::read(&gguf_fixture("target-moe"));
    for (name, t) in parts.tensors.iter_mut() {
        if name.ends_with("ffn_gate_up_exps.weight") {
            let dense = t.dequantize(&Device::Cpu).unwrap();
            *t = QTensor::quantize(&dense, GgmlDType::Q4_1).unwrap();
        }
    }
    let err = load_error(&parts.write(&dir, "experts-q4_1.gguf"));
    assert!(err.contains("Q4_1"), "{err}");
    assert!(err.contains("ffn_gate_up_exps.weight"), "{err}");

    // A quantized norm is refused even in a type the matrices may have.
    let mut parts = Parts::read(&gguf_fixture("target-nople"));
    parts.tensor_as("blk.2.ffn_norm.weight", GgmlDType::Q8_0);
    let err = load_error(&parts.write(&dir, "norm-q8.gguf"));
    assert!(err.contains("Q8_0"), "{err}");
    assert!(err.contains("blk.2.ffn_norm.weight"), "{err}");
}

#[test]
fn expert_files_load_and_their_metadata_must_agree_with_the_tensors() {
    let model = load(&gguf_fixture("target-moe"));
    let moe = model.config().moe.expect("experts");
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.intermediate_size),
        (4, 2, 16)
    );

    let dir = TempDir::new("gemma4-gguf-experts");
    // A router without an expert count would have its block dropped.
    let mut parts = Parts::read(&gguf_fixture("target-moe"));
    parts.metadata.remove("gemma4.expert_count");
    let err = load_error(&parts.write(&dir, "no-count.gguf"));
    assert!(err.contains("blk.0.ffn_gate_inp.weight"), "{err}");
    assert!(err.contains("gemma4.expert_count"), "{err}");

    let mut parts = Parts::read(&gguf_fixture("target-moe"));
    parts.metadata.remove("gemma4.expert_used_count");
    let err = load_error(&parts.write(&dir, "no-top-k.gguf"));
    assert!(err.contains("gemma4.expert_used_count"), "{err}");

    // Experts where the file has none are a missing tensor, named as the converter names it.
    let mut parts = Parts::read(&gguf_fixture("target-nople"));
    parts
        .metadata
        .insert("gemma4.expert_count".into(), Value::U32(4));
    parts
        .metadata
        .insert("gemma4.expert_used_count".into(), Value::U32(2));
    parts
        .metadata
        .insert("gemma4.expert_feed_forward_length".into(), Value::U32(16));
    let err = load_error(&parts.write(&dir, "dense-with-count.gguf"));
    assert!(err.contains("blk.0.ffn_"), "{err}");
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn separate_expert_gate_and_up_tensors_load_as_the_fused_one() {
    let dir = TempDir::new("gemma4-gguf-split-experts");
    let mut parts = Parts::read(&gguf_fixture("target-moe"));
    let fused: Vec<(String, Tensor)> = parts
        .tensors
        .iter()
        .filter(|(n, _)| n.ends_with(".ffn_gate_up_exps.weight"))
        .map(|(n, t)| (n.clone(), t.dequantize(&Device::Cpu).unwrap()))
        .collect();
    assert!(!fused.is_empty());
    parts
        .tensors
        .retain(|(n, _)| !n.ends_with(".ffn_gate_up_exps.weight"));
    for (name, both) in fused {
        let block = name.strip_suffix("ffn_gate_up_exps.weight").unwrap();
        let half = both.dim(1).unwrap() / 2;
        for (part, start) in [("ffn_gate_exps", 0), ("ffn_up_exps", half)] {
            let t = both.narrow(1, start, half).unwrap().contiguous().unwrap();
            parts.tensors.push((
                format!("{block}{part}.weight"),
                QTensor::quantize(&t, GgmlDType::F32).unwrap(),
            ));
        }
    }
    let split = load(&parts.write(&dir, "split.gguf"));
    let fused = load(&gguf_fixture("target-moe"));
    let ids = u32s(&reference("target-moe")["prompts"][0]["prompt_ids"]);
    let (mut a, mut b) = (split.new_cache(16), fused.new_cache(16));
    let all_a = rows(
        &split
            .logits(&split.forward_block(&mut a, &ids).unwrap())
            .unwrap(),
    );
    let all_b = rows(
        &fused
            .logits(&fused.forward_block(&mut b, &ids).unwrap())
            .unwrap(),
    );
    assert_eq!(bits(&all_a), bits(&all_b));
}

#[test]
fn half_precision_files_load_close_to_f32() {
    let dir = TempDir::new("gemma4-gguf-half");
    let f32_model = load(&gguf_fixture("target-full"));
    let ids = u32s(&reference("target-full")["prompts"][1]["prompt_ids"]);
    let mut cache = f32_model.new_cache(16);
    let hidden = f32_model
        .prefill(&mut cache, &ids, DEFAULT_PREFILL_CHUNK)
        .unwrap();
    let want = rows(&f32_model.logits(&hidden).unwrap()).remove(0);
    // Bounds a few times the rounding seen: 0.003 (F16) and 0.02 (BF16) on these weights.
    for (dtype, bound) in [(GgmlDType::F16, 0.01), (GgmlDType::BF16, 0.1)] {
        let mut parts = Parts::read(&gguf_fixture("target-full"));
        parts.matrices_as(dtype);
        let model = load(&parts.write(&dir, &format!("{dtype:?}.gguf")));
        let mut cache = model.new_cache(16);
        let hidden = model
            .prefill(&mut cache, &ids, DEFAULT_PREFILL_CHUNK)
            .unwrap();
        let got = rows(&model.logits(&hidden).unwrap()).remove(0);
        let diff = max_abs_diff(&got, &want);
        assert!(diff < bound, "{dtype:?}: logits differ from F32 by {diff}");
        assert_eq!(argmax(&got), argmax(&want), "{dtype:?}: top token");

        // The half-precision weights run on the CPU engine's kernels as stored: a verify
        // block gives the bits of one-token steps.
        let block = [7u32, 200, 41, 9, 100, 5];
        let mut block_cache = cache.clone();
        let block_rows = rows(&model.forward_block(&mut block_cache, &block).unwrap());
        let mut step_rows = Vec::new();
        for &t in &block {
            step_rows.extend(rows(&model.forward_block(&mut cache, &[t]).unwrap()));
        }
        assert_eq!(
            bits(&block_rows),
            bits(&step_rows),
            "{dtype:?}: block != steps"
        );
    }
}
