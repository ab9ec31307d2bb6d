//! Loading: clear errors naming the tensor or field, and other compute dtypes.

use crate::common::{argmax, copy_fixture, f32s, fixture_dir, reference, u32s};
use candle_core::{DType, Device};
use serde_json::Value;
use specd_models::gemma4::{Gemma4Model, DEFAULT_PREFILL_CHUNK};

fn edit_config(dir: &std::path::Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
}

fn load_err(dir: &std::path::Path) -> String {
    match Gemma4Model::load(dir, DType::F32, &Device::Cpu) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn an_incomplete_moe_config_names_the_missing_field() {
    let dir = copy_fixture("target-full");
    edit_config(dir.path(), |c| c["enable_moe_block"] = Value::Bool(true));
    let err = load_err(dir.path());
    assert!(
        err.contains("num_experts") && err.contains("enable_moe_block"),
        "{err}"
    );
    edit_config(dir.path(), |c| {
        c["num_experts"] = Value::from(4);
        c["top_k_experts"] = Value::from(5);
        c["moe_intermediate_size"] = Value::from(16);
    });
    let err = load_err(dir.path());
    assert!(
        err.contains("top_k_experts") && err.contains("exceeds num_experts 4"),
        "{err}"
    );
    // A complete config over a dense checkpoint: the experts' tensors are missing, by name.
    edit_config(dir.path(), |c| c["top_k_experts"] = Value::from(2));
    let err = load_err(dir.path());
    assert!(err.contains("experts.gate_up_proj"), "{err}");
}

#[test]
fn a_missing_tensor_is_named() {
    // An untied head with no lm_head.weight in the file.
    let dir = copy_fixture("target-full");
    edit_config(dir.path(), |c| {
        c["tie_word_embeddings"] = Value::Bool(false)
    });
    let err = load_err(dir.path());
    assert!(
        err.contains("lm_head.weight") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn a_shape_mismatch_names_the_tensor_and_both_shapes() {
    let dir = copy_fixture("target-full");
    edit_config(dir.path(), |c| c["intermediate_size"] = Value::from(96));
    let err = load_err(dir.path());
    assert!(err.contains("model.layers.0.mlp.gate_proj.weight"), "{err}");
    assert!(
        err.contains("[96, 64]") && err.contains("[64, 64]"),
        "{err}"
    );
}

#[test]
fn bad_config_fields_are_named() {
    let dir = copy_fixture("target-full");
    edit_config(dir.path(), |c| {
        c["layer_types"][1] = Value::from("local_attention")
    });
    let err = load_err(dir.path());
    assert!(err.contains("layer_types[1]"), "{err}");

    let dir = copy_fixture("target-full");
    edit_config(dir.path(), |c| {
        c.as_object_mut().unwrap().remove("hidden_size");
    });
    let err = load_err(dir.path());
    assert!(
        err.contains("hidden_size") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn a_missing_shard_is_named() {
    let dir = copy_fixture("target-sharded-bf16");
    let shard = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .unwrap();
    std::fs::remove_file(&shard).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains(shard.file_name().unwrap().to_str().unwrap()),
        "{err}"
    );
}

#[test]
fn bf16_compute_follows_the_f32_reference_closely() {
    let name = "target-sharded-bf16";
    let model = Gemma4Model::load(&fixture_dir(name), DType::BF16, &Device::Cpu).unwrap();
    let reference = reference(name);
    for prompt in reference["prompts"].as_array().unwrap() {
        let mut cache = model.new_cache(16);
        let hidden = model
            .prefill(
                &mut cache,
                &u32s(&prompt["prompt_ids"]),
                DEFAULT_PREFILL_CHUNK,
            )
            .unwrap();
        let logits: Vec<f32> = model
            .logits(&hidden)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .get(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        let want = f32s(&prompt["last_logits"]);
        let diff = crate::common::max_abs_diff(&logits, &want);
        // bf16 keeps about 3 significant digits; the reference logits are softcapped to |x| < 3.
        assert!(diff < 0.1, "bf16 logits differ by {diff}");
        let margin = prompt["greedy_margins"][0].as_f64().unwrap() as f32;
        if margin > 2.0 * diff {
            assert_eq!(argmax(&logits), argmax(&want));
        }
    }
}
