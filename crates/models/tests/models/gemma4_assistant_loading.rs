//! Loading a Gemma 4 assistant: its config, the target's embedding table read from either
//! checkpoint layout, and the refusal of pairs and options it cannot run.

use crate::common::{copy_fixture, fixture_dir};
use candle_core::{DType, Device};
use serde_json::Value;
use specd_models::gemma4::{Gemma4Model, Gemma4TextConfig, LayerKind};
use specd_models::gemma4_assistant::{Gemma4Assistant, Gemma4AssistantConfig, TargetEmbedding};

fn load(assistant: &std::path::Path, target: &str) -> Result<Gemma4Assistant, String> {
    Gemma4Assistant::load(assistant, &fixture_dir(target), DType::F32, &Device::Cpu)
        .map_err(|e| e.to_string())
}

/// A copy of `name` whose config.json was changed by `edit`.
fn edited(name: &str, edit: impl FnOnce(&mut Value)) -> crate::common::tempdir::TempDir {
    let dir = copy_fixture(name);
    let path = dir.path().join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    dir
}

#[test]
fn assistant_configs_resolve_like_transformers() {
    for (name, full_kv_heads, centroid) in [
        ("assistant-dense", 1, false),
        ("assistant-centroid", 1, true),
        ("assistant-nople", 2, false),
    ] {
        let cfg = Gemma4AssistantConfig::from_dir(&fixture_dir(name)).unwrap();
        assert_eq!(
            (cfg.hidden_size(), cfg.backbone_hidden_size),
            (32, 64),
            "{name}"
        );
        assert_eq!(cfg.text.num_layers, 4);
        assert_eq!(
            cfg.text.num_kv_shared_layers, 4,
            "{name}: every layer reads the target's K/V"
        );
        assert_eq!(cfg.use_ordered_embeddings, centroid);
        assert!(cfg.tie_word_embeddings);
        assert_eq!(cfg.block_size, None);
        let geometry: Vec<(LayerKind, usize, usize)> = cfg
            .text
            .layers
            .iter()
            .map(|l| (l.kind, l.head_dim, l.num_kv_heads))
            .collect();
        assert_eq!(
            geometry,
            [
                (LayerKind::Sliding, 16, 2),
                (LayerKind::Full, 32, full_kv_heads),
                (LayerKind::Sliding, 16, 2),
                (LayerKind::Full, 32, full_kv_heads)
            ],
            "{name}"
        );
        if centroid {
            assert_eq!(
                (cfg.num_centroids, cfg.centroid_intermediate_top_k),
                (16, 4)
            );
        }
        assert_eq!(cfg.sliding_keys_visible(), 9);
    }
    let dir = edited("assistant-dense", |c| c["block_size"] = Value::from(4));
    assert_eq!(
        Gemma4AssistantConfig::from_dir(dir.path())
            .unwrap()
            .block_size,
        Some(4)
    );
}

#[test]
fn target_embedding_is_read_from_either_checkpoint_layout() {
    for target in ["target-full", "target-multimodal", "target-sharded-bf16"] {
        let dir = fixture_dir(target);
        let (cfg, layout) = Gemma4TextConfig::from_dir(&dir).unwrap();
        let embedding =
            TargetEmbedding::open(&dir, &cfg, &layout, DType::F32, &Device::Cpu).unwrap();
        let model = Gemma4Model::load(&dir, DType::F32, &Device::Cpu).unwrap();
        let scale = (cfg.hidden_size as f32).sqrt();
        for token in [0u32, 2, 17, 255] {
            let row: Vec<f32> = model
                .embedding_table()
                .get(token as usize)
                .unwrap()
                .to_vec1()
                .unwrap();
            let want: Vec<f32> = row.iter().map(|x| x * scale).collect();
            let got: Vec<f32> = embedding
                .embed(token)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_eq!(got, want, "{target} token {token}");
        }
        let err = embedding.embed(256).unwrap_err().to_string();
        assert!(err.contains("256"), "{err}");
    }
    // The multimodal checkpoint keeps the text weights under model.language_model.
    let assistant = load(&fixture_dir("assistant-nople"), "target-multimodal").unwrap();
    assert_eq!(assistant.config().backbone_hidden_size, 64);
}

#[test]
fn mismatched_pair_is_refused_naming_both_geometries() {
    // assistant-dense reads 1 K/V head on full layers; target-nople's full layers have 2.
    let err = load(&fixture_dir("assistant-dense"), "target-nople")
        .err()
        .unwrap();
    assert!(err.contains("full_attention"), "{err}");
    assert!(
        err.contains("1 heads x 32 dims") && err.contains("2 heads x 32 dims"),
        "{err}"
    );

    let err = load(&fixture_dir("assistant-nople"), "target-full")
        .err()
        .unwrap();
    assert!(
        err.contains("2 heads x 32 dims") && err.contains("1 heads x 32 dims"),
        "{err}"
    );

    let dir = edited("assistant-dense", |c| {
        c["backbone_hidden_size"] = Value::from(48)
    });
    let err = load(dir.path(), "target-full").err().unwrap();
    assert!(
        err.contains("backbone_hidden_size") && err.contains("48") && err.contains("64"),
        "{err}"
    );

    let dir = edited("assistant-dense", |c| {
        c["text_config"]["vocab_size"] = Value::from(512)
    });
    let err = load(dir.path(), "target-full").err().unwrap();
    assert!(
        err.contains("vocab_size") && err.contains("512") && err.contains("256"),
        "{err}"
    );

    let dir = edited("assistant-dense", |c| {
        c["text_config"]["per_layer_config"]["0"] = serde_json::json!({"head_dim": 8});
        c["text_config"]["per_layer_config"]["2"] = serde_json::json!({"head_dim": 8});
    });
    let err = load(dir.path(), "target-full").err().unwrap();
    assert!(
        err.contains("sliding_attention")
            && err.contains("2 heads x 8 dims")
            && err.contains("2 heads x 16 dims"),
        "{err}"
    );

    // Layers of one kind must agree with each other, since they read the same K/V.
    let dir = edited("assistant-dense", |c| {
        c["text_config"]["per_layer_config"]["0"] = serde_json::json!({"head_dim": 8})
    });
    let err = load(dir.path(), "target-full").err().unwrap();
    assert!(err.contains("layers 0 and 2"), "{err}");
}

type ConfigEdit = fn(&mut Value);

#[test]
fn unsupported_assistant_options_are_refused() {
    let cases: [(&str, ConfigEdit); 6] = [
        ("enable_moe_block", |c| {
            c["text_config"]["enable_moe_block"] = Value::from(true)
        }),
        ("hidden_size_per_layer_input", |c| {
            c["text_config"]["hidden_size_per_layer_input"] = Value::from(16)
        }),
        ("hidden_size_per_layer_input", |c| {
            c["text_config"]
                .as_object_mut()
                .unwrap()
                .remove("hidden_size_per_layer_input");
        }),
        ("use_double_wide_mlp", |c| {
            c["text_config"]["use_double_wide_mlp"] = Value::from(true)
        }),
        ("num_kv_shared_layers", |c| {
            c["text_config"]["num_kv_shared_layers"] = Value::from(2)
        }),
        ("model_type", |c| {
            c["model_type"] = Value::from("gemma4_text")
        }),
    ];
    for (field, edit) in cases {
        let dir = edited("assistant-dense", edit);
        let err = load(dir.path(), "target-full").err().unwrap();
        assert!(err.contains(field), "{field}: {err}");
    }
    let dir = edited("assistant-centroid", |c| {
        c["num_centroids"] = Value::from(15)
    });
    let err = load(dir.path(), "target-full").err().unwrap();
    assert!(err.contains("num_centroids") && err.contains("15"), "{err}");

    // An absent kv-sharing count means "every layer", as in transformers.
    let dir = edited("assistant-dense", |c| {
        c["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("num_kv_shared_layers");
    });
    load(dir.path(), "target-full").unwrap();
}

#[test]
fn missing_weights_are_named() {
    let dir = copy_fixture("assistant-dense");
    let path = dir.path().join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    tensors.remove("pre_projection.weight");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let err = load(dir.path(), "target-full").err().unwrap();
    assert!(err.contains("pre_projection.weight"), "{err}");
}
