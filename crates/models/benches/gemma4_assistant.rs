//! Cost of a Gemma 4 assistant draft block against one target verify forward, on the medium
//! random target of tools/bench_torch_gemma4.py and a matching random assistant built here.
//!
//! For K = 3 and 7 it times a draft block of K steps (dense head and centroid head; back to back,
//! and each right after an untimed target verify forward, as in a round) and a
//! target forward of the K + 1 verify tokens on a 128-token context, and prints the cost ratio
//! c = (draft block / K) / target forward, the number the speculative speed-up depends on
//! (also against a one-token target decode step, the classic definition of c).
//! Run with `cargo bench -p specd-models --bench gemma4_assistant`.
//! `SPECD_BENCH_GEMMA4_DIR` (default /tmp/gemma4-medium) is the target checkpoint (a directory
//! or a `gemma4` GGUF file), `SPECD_BENCH_RUNS` (default 9) the samples per median,
//! `SPECD_BENCH_DRAFT` (default 3,7) the draft lengths K. With `SPECD_BENCH_GEMMA4_ASSISTANT`
//! (a directory or a `gemma4-assistant` GGUF file, e.g. the one tools/bench_gemma4_mtp.sh
//! makes) that assistant is timed (as "assistant_saved") instead of the two built here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

mod common;

use candle_core::{DType, Device, Tensor};
use common::{ids, median_ms};
use serde_json::{json, Value};
use specd_models::gemma4::{Gemma4Model, Gemma4TextConfig, LayerKind, DEFAULT_PREFILL_CHUNK};
use specd_models::gemma4_assistant::Gemma4Assistant;

const PROMPT_LEN: usize = 128;
const DRAFT_LENGTHS: [usize; 2] = [3, 7];

/// The draft lengths K: `SPECD_BENCH_DRAFT` (comma-separated) or [`DRAFT_LENGTHS`].
fn draft_lengths() -> Vec<usize> {
    match std::env::var("SPECD_BENCH_DRAFT") {
        Ok(list) => list
            .split(',')
            .map(|k| {
                k.trim()
                    .parse()
                    .expect("SPECD_BENCH_DRAFT: comma-separated lengths")
            })
            .collect(),
        Err(_) => DRAFT_LENGTHS.to_vec(),
    }
}

/// The assistant's width and depth, in the proportions of the published Gemma 4 assistants
/// (a few layers, a fraction of the target's width).
const HIDDEN: usize = 256;
const INTERMEDIATE: usize = 1024;
const HEADS: usize = 4;
const LAYERS: [LayerKind; 4] = [
    LayerKind::Sliding,
    LayerKind::Full,
    LayerKind::Sliding,
    LayerKind::Full,
];
/// The centroid head scores 32 of 2048 clusters, 1/64 of the vocabulary, as the published
/// checkpoints do.
const CENTROIDS: usize = 2048;
const TOP_K: usize = 32;

/// Seeded normal-ish values (sum of uniforms), scaled.
struct Noise(u64);

impl Noise {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }

    fn normal(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n)
            .map(|_| ((0..4).map(|_| self.uniform()).sum::<f32>() - 2.0) * std * 1.732)
            .collect()
    }

    fn range(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * self.uniform()).collect()
    }
}

fn tensor(values: Vec<f32>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
}

fn linear(noise: &mut Noise, out: usize, inp: usize) -> Tensor {
    tensor(
        noise.normal(out * inp, 0.7 / (inp as f32).sqrt()),
        &[out, inp],
    )
}

/// Writes a random assistant fitting `target` into `dir`, with a dense or a centroid head.
fn write_assistant(dir: &Path, target: &Gemma4TextConfig, centroid: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let sliding = &target.layers[target.last_kv_producer(LayerKind::Sliding).unwrap()];
    let full = &target.layers[target.last_kv_producer(LayerKind::Full).unwrap()];
    let (vocab, ht) = (target.vocab_size, target.hidden_size);
    let mut per_layer = serde_json::Map::new();
    for (i, kind) in LAYERS.iter().enumerate() {
        if *kind == LayerKind::Full {
            per_layer.insert(
                i.to_string(),
                json!({"head_dim": full.head_dim, "num_key_value_heads": full.num_kv_heads}),
            );
        }
    }
    let config = json!({
        "model_type": "gemma4_assistant",
        "architectures": ["Gemma4AssistantForCausalLM"],
        "backbone_hidden_size": ht,
        "use_ordered_embeddings": centroid,
        "num_centroids": CENTROIDS,
        "centroid_intermediate_top_k": TOP_K,
        "tie_word_embeddings": true,
        "text_config": {
            "model_type": "gemma4_text",
            "vocab_size": vocab,
            "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": LAYERS.len(),
            "num_attention_heads": HEADS,
            "num_key_value_heads": sliding.num_kv_heads,
            "head_dim": sliding.head_dim,
            "layer_types": LAYERS.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
            "per_layer_config": per_layer,
            "sliding_window": target.sliding_window,
            "num_kv_shared_layers": LAYERS.len(),
            "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 0,
            "rms_norm_eps": target.rms_norm_eps,
            "max_position_embeddings": target.max_position_embeddings,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": target.rope_sliding.theta},
                "full_attention": {
                    "rope_type": "proportional",
                    "partial_rotary_factor": target.rope_full.partial_rotary_factor,
                    "rope_theta": target.rope_full.theta
                }
            }
        }
    });
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();

    let mut noise = Noise(0x5eed_a551_57a7);
    let mut w: HashMap<String, Tensor> = HashMap::new();
    w.insert(
        "model.embed_tokens.weight".into(),
        tensor(noise.normal(vocab * HIDDEN, 0.1), &[vocab, HIDDEN]),
    );
    w.insert(
        "pre_projection.weight".into(),
        linear(&mut noise, HIDDEN, 2 * ht),
    );
    w.insert(
        "post_projection.weight".into(),
        linear(&mut noise, ht, HIDDEN),
    );
    w.insert(
        "model.norm.weight".into(),
        tensor(noise.range(HIDDEN, 0.6, 1.4), &[HIDDEN]),
    );
    for (i, kind) in LAYERS.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let hd = if *kind == LayerKind::Full {
            full.head_dim
        } else {
            sliding.head_dim
        };
        w.insert(
            format!("{p}.self_attn.q_proj.weight"),
            linear(&mut noise, HEADS * hd, HIDDEN),
        );
        w.insert(
            format!("{p}.self_attn.o_proj.weight"),
            linear(&mut noise, HIDDEN, HEADS * hd),
        );
        w.insert(
            format!("{p}.self_attn.q_norm.weight"),
            tensor(noise.range(hd, 0.3, 0.7), &[hd]),
        );
        w.insert(
            format!("{p}.mlp.gate_proj.weight"),
            linear(&mut noise, INTERMEDIATE, HIDDEN),
        );
        w.insert(
            format!("{p}.mlp.up_proj.weight"),
            linear(&mut noise, INTERMEDIATE, HIDDEN),
        );
        w.insert(
            format!("{p}.mlp.down_proj.weight"),
            linear(&mut noise, HIDDEN, INTERMEDIATE),
        );
        for (norm, scale) in [
            ("input_layernorm", 1.0),
            ("post_attention_layernorm", 0.4),
            ("pre_feedforward_layernorm", 1.0),
            ("post_feedforward_layernorm", 0.4),
        ] {
            w.insert(
                format!("{p}.{norm}.weight"),
                tensor(noise.range(HIDDEN, 0.6 * scale, 1.4 * scale), &[HIDDEN]),
            );
        }
        w.insert(
            format!("{p}.layer_scalar"),
            tensor(noise.range(1, 0.6, 1.1), &[1]),
        );
    }
    if centroid {
        w.insert(
            "masked_embedding.centroids.weight".into(),
            linear(&mut noise, CENTROIDS, HIDDEN),
        );
        // A seeded permutation of the vocabulary.
        let mut ordering: Vec<i64> = (0..vocab as i64).collect();
        for i in (1..ordering.len()).rev() {
            let j = (noise.uniform() * (i + 1) as f32) as usize % (i + 1);
            ordering.swap(i, j);
        }
        w.insert(
            "masked_embedding.token_ordering".into(),
            Tensor::new(ordering, &Device::Cpu).unwrap(),
        );
    }
    candle_core::safetensors::save(&w, dir.join("model.safetensors")).unwrap();
}

/// Median wall time of `runs` calls of `timed` in milliseconds, each right after an untimed
/// call of `before`, after one warm-up pair.
fn median_ms_after(runs: usize, mut before: impl FnMut(), mut timed: impl FnMut()) -> f64 {
    before();
    timed();
    let mut samples: Vec<f64> = (0..runs)
        .map(|_| {
            before();
            let t = std::time::Instant::now();
            timed();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    let Some(target_dir) = common::medium_checkpoint() else {
        return;
    };
    let runs = common::runs(9);
    let draft_lengths = draft_lengths();
    let target = Gemma4Model::load(&target_dir, DType::F32, &Device::Cpu).expect("load the target");
    let cfg = target.config().clone();
    let scratch =
        std::env::temp_dir().join(format!("specd-bench-assistant-{}", std::process::id()));

    let mut prompt = ids(1, PROMPT_LEN, cfg.vocab_size);
    prompt[0] = 2;
    let mut context = target.new_cache(16);
    let hidden = target
        .prefill(&mut context, &prompt, DEFAULT_PREFILL_CHUNK)
        .unwrap();
    let snapshot = target.shared_kv(&context, 0, context.len()).unwrap();
    let bonus = 1000;

    let mut report = serde_json::Map::new();
    let mut target_ms = serde_json::Map::new();
    let decode_ms = median_ms(runs, || {
        let mut cache = context.clone();
        let h = target.forward_block(&mut cache, &[bonus]).unwrap();
        target.logits(&h).unwrap();
    });
    target_ms.insert("bs1".into(), json!({"with_logits_ms": decode_ms}));
    for k in draft_lengths.iter().copied() {
        let block = ids(k as u64 + 7, k + 1, cfg.vocab_size);
        let hidden_only = median_ms(runs, || {
            let mut cache = context.clone();
            target.forward_block(&mut cache, &block).unwrap();
        });
        let with_logits = median_ms(runs, || {
            let mut cache = context.clone();
            let h = target.forward_block(&mut cache, &block).unwrap();
            target.logits(&h).unwrap();
        });
        target_ms.insert(
            format!("bs{}", k + 1),
            json!({"hidden_only_ms": hidden_only, "with_logits_ms": with_logits}),
        );
    }
    report.insert(
        "target_verify_forward".into(),
        Value::Object(target_ms.clone()),
    );

    let assistants: Vec<(&str, PathBuf)> = match std::env::var_os("SPECD_BENCH_GEMMA4_ASSISTANT") {
        Some(path) => vec![("saved", PathBuf::from(path))],
        None => [("dense", false), ("centroid", true)]
            .into_iter()
            .map(|(head, centroid)| {
                let dir = scratch.join(head);
                write_assistant(&dir, &cfg, centroid);
                (head, dir)
            })
            .collect(),
    };
    for (head, dir) in assistants {
        let assistant = Gemma4Assistant::load(&dir, &target_dir, DType::F32, &Device::Cpu)
            .expect("load the assistant");
        let mirror = assistant.new_mirror(&snapshot).unwrap();
        // One step's body (embedding, projections, layers) and its greedy head, apart.
        let step = assistant.step(&mirror, bonus, &hidden).unwrap();
        let body_ms = median_ms(runs, || {
            assistant.step(&mirror, bonus, &hidden).unwrap();
        });
        let head_ms = median_ms(runs, || {
            assistant.argmax(&step.normed).unwrap();
        });
        let mut by_k = serde_json::Map::new();
        for k in draft_lengths.iter().copied() {
            let block_ms = median_ms(runs, || {
                assistant.draft_greedy(&mirror, bonus, &hidden, k).unwrap();
            });
            // The same block right after a target verify forward of K + 1 tokens with its
            // logits (not timed), as a round runs it: the draft follows the verify.
            let verify_block = ids(k as u64 + 7, k + 1, cfg.vocab_size);
            let after_verify_ms = median_ms_after(
                runs,
                || {
                    let mut cache = context.clone();
                    let h = target.forward_block(&mut cache, &verify_block).unwrap();
                    target.logits(&h).unwrap();
                },
                || {
                    assistant.draft_greedy(&mirror, bonus, &hidden, k).unwrap();
                },
            );
            let verify = &target_ms[&format!("bs{}", k + 1)];
            let step_ms = block_ms / k as f64;
            by_k.insert(
                format!("k{k}"),
                json!({
                    "draft_block_ms": block_ms,
                    "draft_step_ms": step_ms,
                    "draft_block_after_verify_ms": after_verify_ms,
                    "draft_step_after_verify_ms": after_verify_ms / k as f64,
                    "c_vs_hidden_only": step_ms / verify["hidden_only_ms"].as_f64().unwrap_or(f64::NAN),
                    "c_vs_with_logits": step_ms / verify["with_logits_ms"].as_f64().unwrap_or(f64::NAN),
                    "c_vs_decode_step": step_ms / decode_ms,
                }),
            );
        }
        // Applying one round's committed rows to a session mirror.
        let mut cache = context.clone();
        target.forward_block(&mut cache, &[5, 6, 7]).unwrap();
        let delta = target
            .shared_kv(&cache, PROMPT_LEN, PROMPT_LEN + 3)
            .unwrap();
        let delta_ms = median_ms(runs, || {
            let mut m = assistant.new_mirror(&snapshot).unwrap();
            m.apply_delta(&delta).unwrap();
        });
        let snapshot_ms = median_ms(runs, || {
            assistant.new_mirror(&snapshot).unwrap();
        });
        by_k.insert("step_body_ms".into(), json!(body_ms));
        by_k.insert("greedy_head_ms".into(), json!(head_ms));
        by_k.insert("mirror_from_snapshot_ms".into(), json!(snapshot_ms));
        by_k.insert(
            "mirror_snapshot_plus_3_row_delta_ms".into(),
            json!(delta_ms),
        );
        report.insert(format!("assistant_{head}"), Value::Object(by_k));
    }
    let _ = std::fs::remove_dir_all(&scratch);

    let out = json!({
        "engine": "specd candle (CPU f32)",
        "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "runs": runs,
        "context_tokens": PROMPT_LEN,
        "target": {"hidden": cfg.hidden_size, "layers": cfg.num_layers, "vocab": cfg.vocab_size},
        "target_path": target_dir.display().to_string(),
        "assistant": match std::env::var_os("SPECD_BENCH_GEMMA4_ASSISTANT") {
            Some(path) => json!({"path": Path::new(&path).display().to_string()}),
            None => json!({"hidden": HIDDEN, "intermediate": INTERMEDIATE, "layers": LAYERS.len(),
                           "heads": HEADS, "centroids": CENTROIDS, "top_k": TOP_K}),
        },
        "results": report,
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}
