//! Timing of the real Qwen2.5-Coder pair on this machine: one target decode step, a verify
//! block of K+1 tokens for K = 1..=6, and one drafter step, with the ratios that decide the
//! speculative speed-up. Run with `cargo bench -p specd-models --bench qwen2_pair`.
//! `SPECD_BENCH_ABLATIONS=1` also times the target without row-exact matmuls and the drafter
//! without requantization.

#[path = "../tests/qwen2_support/mod.rs"]
mod qwen2_support;

use std::time::{Duration, Instant};

use candle_core::Device;
use specd_models::qwen2::{
    ChatMessage, ChatTemplate, GgufFile, KvCache, LoadOptions, Qwen2Model, Qwen2Tokenizer,
};

const REPEATS: usize = 9;

fn median(mut xs: Vec<Duration>) -> f64 {
    xs.sort();
    xs[xs.len() / 2].as_secs_f64() * 1e3
}

fn load(path: &std::path::Path, options: &LoadOptions) -> Qwen2Model {
    let started = Instant::now();
    let model = Qwen2Model::load_with(path, &Device::Cpu, options).unwrap();
    println!(
        "loaded {} in {:.1} s",
        path.file_name().unwrap().to_string_lossy(),
        started.elapsed().as_secs_f64()
    );
    model
}

/// Prefills `prompt` and returns the cache and the greedy next token.
fn prefill(model: &Qwen2Model, prompt: &[u32]) -> (KvCache, u32) {
    let mut cache = model.new_cache().unwrap();
    let started = Instant::now();
    let logits = model.forward_block(prompt, &mut cache).unwrap();
    println!(
        "  prefill of {} tokens: {:.1} ms",
        prompt.len(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let next = qwen2_support::argmax_rows(&logits)[prompt.len() - 1];
    (cache, next)
}

/// Median time of a one-token step, decoding greedily.
fn decode_step_ms(model: &Qwen2Model, cache: &mut KvCache, mut token: u32) -> f64 {
    let mut times = Vec::new();
    for _ in 0..REPEATS {
        let started = Instant::now();
        let logits = model.forward_block(&[token], cache).unwrap();
        times.push(started.elapsed());
        token = qwen2_support::argmax_rows(&logits)[0];
    }
    median(times)
}

/// Median time of a `len`-token block, rolled back after each run.
fn block_ms(model: &Qwen2Model, cache: &mut KvCache, len: usize) -> f64 {
    let block: Vec<u32> = (0..len as u32).map(|i| 1000 + 37 * i).collect();
    let keep = cache.len();
    let mut times = Vec::new();
    for _ in 0..REPEATS {
        let started = Instant::now();
        model.forward_block(&block, cache).unwrap();
        times.push(started.elapsed());
        cache.truncate(keep).unwrap();
    }
    median(times)
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let Some((target_path, drafter_path)) = qwen2_support::real_pair("qwen2_pair bench") else {
        return;
    };
    let threads = rayon::current_num_threads();
    println!("Qwen2.5-Coder pair on CPU ({threads} threads), median of {REPEATS} runs");

    let gguf = GgufFile::open(&target_path).unwrap();
    let tokenizer = Qwen2Tokenizer::from_gguf_metadata(gguf.metadata()).unwrap();
    let template = ChatTemplate::from_gguf_metadata(gguf.metadata()).unwrap();
    let messages = [ChatMessage::user(
        "Write a Python function that checks whether a string is a palindrome.",
    )];
    let prompt = tokenizer
        .encode(&template.render(&messages, true).unwrap())
        .unwrap();

    let options = LoadOptions::default();
    let target = load(&target_path, &options);
    let drafter = load(&drafter_path, &options);

    let (mut target_cache, next) = prefill(&target, &prompt);
    let target_step = decode_step_ms(&target, &mut target_cache, next);
    let (mut drafter_cache, next) = prefill(&drafter, &prompt);
    let drafter_step = decode_step_ms(&drafter, &mut drafter_cache, next);

    println!("target decode step (1 token):  {target_step:7.1} ms");
    println!(
        "drafter decode step (1 token): {drafter_step:7.1} ms   drafter/target = {:.2}",
        drafter_step / target_step
    );
    println!(
        "target verify block of K+1 tokens (context {} tokens):",
        target_cache.len()
    );
    for k in 1..=6 {
        let ms = block_ms(&target, &mut target_cache, k + 1);
        // Speculation pays when K drafter steps plus one verify beat the tokens it yields.
        println!(
            "  K={k}: {ms:7.1} ms   verify/step = {:.2}   (K drafter steps + verify) / step = {:.2}",
            ms / target_step,
            (k as f64 * drafter_step + ms) / target_step
        );
    }

    if std::env::var("SPECD_BENCH_ABLATIONS").as_deref() == Ok("1") {
        drop((target, drafter));
        let plain = LoadOptions {
            row_invariant_matmul: false,
            ..LoadOptions::default()
        };
        let target = load(&target_path, &plain);
        let (mut cache, next) = prefill(&target, &prompt);
        let step = decode_step_ms(&target, &mut cache, next);
        println!("target decode step without row-exact matmuls: {step:7.1} ms (row-exact: {target_step:.1} ms)");
        drop(target);
        let slow = LoadOptions {
            requantize_slow_formats: false,
            ..LoadOptions::default()
        };
        let drafter = load(&drafter_path, &slow);
        let (mut cache, next) = prefill(&drafter, &prompt);
        let step = decode_step_ms(&drafter, &mut cache, next);
        println!("drafter decode step with Q5_0 kept:           {step:7.1} ms (Q8_0: {drafter_step:.1} ms)");
    }
}
