//! Prefill and verify-block cost of the Gemma 4 target on a medium random checkpoint, side by
//! side with transformers on the same checkpoint (tools/bench_gemma4.sh runs both) or with
//! llama.cpp on its GGUF conversions (tools/bench_gemma4_gguf.sh).
//!
//! `SPECD_BENCH_GEMMA4_DIR` (default /tmp/gemma4-medium) is the checkpoint written by
//! tools/bench_torch_gemma4.py, or a GGUF file of it; `SPECD_BENCH_TORCH_JSON`, when set, is
//! that script's output, and ratios specd/torch are printed for the block sizes it measured.

mod common;

use candle_core::{DType, Device};
use common::{ids, median_ms};
use serde_json::{json, Value};
use specd_models::cpu::ThreadPool;
use specd_models::gemma4::{Gemma4Model, DEFAULT_PREFILL_CHUNK};

const PROMPT_LEN: usize = 128;
/// Verify blocks of K + 1 tokens for K = 0..7.
const BLOCK_SIZES: [usize; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

fn main() {
    let Some(dir) = common::medium_checkpoint() else {
        return;
    };
    let runs = common::runs(5);
    let model = Gemma4Model::load(&dir, DType::F32, &Device::Cpu).expect("load the checkpoint");
    let vocab = model.config().vocab_size;
    let mut prompt = ids(1, PROMPT_LEN, vocab);
    prompt[0] = 2;

    let prefill_ms = median_ms(runs, || {
        let mut cache = model.new_cache(16);
        let h = model
            .prefill(&mut cache, &prompt, DEFAULT_PREFILL_CHUNK)
            .unwrap();
        model.logits(&h).unwrap();
    });
    let mut context = model.new_cache(16);
    model
        .prefill(&mut context, &prompt, DEFAULT_PREFILL_CHUNK)
        .unwrap();
    let mut blocks = serde_json::Map::new();
    for bs in BLOCK_SIZES {
        let block = ids(bs as u64 + 7, bs, vocab);
        let with_logits = median_ms(runs, || {
            let mut cache = context.clone();
            let h = model.forward_block(&mut cache, &block).unwrap();
            model.logits(&h).unwrap();
        });
        let hidden_only = median_ms(runs, || {
            let mut cache = context.clone();
            model.forward_block(&mut cache, &block).unwrap();
        });
        blocks.insert(
            bs.to_string(),
            json!({ "median_ms": with_logits, "hidden_only_ms": hidden_only }),
        );
    }
    let bs1 = blocks["1"]["median_ms"].as_f64().unwrap_or(f64::NAN);
    let mut report = json!({
        "engine": "specd (CPU, f32 compute)",
        "threads": ThreadPool::global().threads(),
        "runs": runs,
        "prefill": { "tokens": PROMPT_LEN, "median_ms": prefill_ms },
        "block_on_context": { "context_tokens": PROMPT_LEN, "by_block_size": blocks },
        "bs4_over_bs1": blocks_ratio(&blocks, "4", bs1),
        "bs8_over_bs1": blocks_ratio(&blocks, "8", bs1),
    });
    if let Ok(path) = std::env::var("SPECD_BENCH_TORCH_JSON") {
        let torch: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read the torch json"))
                .unwrap();
        let mut ratios = serde_json::Map::new();
        ratios.insert(
            "prefill".into(),
            json!(prefill_ms / torch["prefill"]["median_ms"].as_f64().unwrap_or(f64::NAN)),
        );
        for bs in BLOCK_SIZES {
            let k = bs.to_string();
            let ours = report["block_on_context"]["by_block_size"][&k]["median_ms"]
                .as_f64()
                .unwrap_or(f64::NAN);
            if let Some(theirs) =
                torch["block_on_context"]["by_block_size"][&k]["median_ms"].as_f64()
            {
                ratios.insert(format!("block_bs{bs}"), json!(ours / theirs));
            }
        }
        report["specd_over_torch_time"] = Value::Object(ratios);
        report["torch"] = torch;
    }
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}

fn blocks_ratio(blocks: &serde_json::Map<String, Value>, bs: &str, bs1: f64) -> f64 {
    blocks[bs]["median_ms"].as_f64().unwrap_or(f64::NAN) / bs1
}
