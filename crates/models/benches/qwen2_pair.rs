//! Timing of the real Qwen2.5-Coder pair on this machine: one target decode step, a verify
//! block of K+1 tokens for K = 1..=6, and one drafter step, with the ratios that decide the
//! speculative speed-up. Run with `cargo bench -p specd-models --bench qwen2_pair`.
//!
//! Each figure is a median of several runs, as wall-clock time and, on Linux, as CPU time of
//! the calling thread (the compute pool's other threads are not counted in it).
//! `SPECD_BENCH_CANDLE=1` also times both models on candle's kernels (`Backend::Candle`).

#[path = "../tests/models/qwen2_support/mod.rs"]
mod qwen2_support;

use std::time::{Duration, Instant};

use candle_core::Device;
use specd_models::qwen2::{Backend, GgufFile, KvCache, LoadOptions, Qwen2Model};
use specd_text::{ChatMessage, ChatTemplate, GgufTokenizer};

const REPEATS: usize = 9;

/// Greedy top-1 agreement of this drafter with this target, measured on code and prose prompts
/// (shared/reference/models.md); used only for the speed-up estimate.
const ALPHA: f64 = 0.917;

/// CPU time this thread has run, from the scheduler's statistics (Linux only).
fn thread_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(Duration::from_nanos(
        stat.split_whitespace().next()?.parse().ok()?,
    ))
}

/// Median wall-clock and thread-CPU milliseconds.
#[derive(Clone, Copy)]
struct Timing {
    wall_ms: f64,
    cpu_ms: Option<f64>,
}

impl Timing {
    fn of(samples: &[(Duration, Option<Duration>)]) -> Self {
        let median = |mut xs: Vec<Duration>| {
            xs.sort();
            xs[xs.len() / 2].as_secs_f64() * 1e3
        };
        let cpu: Option<Vec<Duration>> = samples.iter().map(|s| s.1).collect();
        Self {
            wall_ms: median(samples.iter().map(|s| s.0).collect()),
            cpu_ms: cpu.map(median),
        }
    }

    fn show(&self) -> String {
        match self.cpu_ms {
            Some(cpu) => format!("{:7.1} ms wall {cpu:7.1} ms cpu", self.wall_ms),
            None => format!("{:7.1} ms wall", self.wall_ms),
        }
    }

    /// The ratio to `base`, by CPU time where both have it.
    fn ratio(&self, base: &Timing) -> f64 {
        match (self.cpu_ms, base.cpu_ms) {
            (Some(a), Some(b)) => a / b,
            _ => self.wall_ms / base.wall_ms,
        }
    }
}

fn timed<R>(f: impl FnOnce() -> R) -> (R, (Duration, Option<Duration>)) {
    let (cpu0, started) = (thread_cpu(), Instant::now());
    let r = f();
    let wall = started.elapsed();
    let cpu = thread_cpu().zip(cpu0).map(|(b, a)| b.saturating_sub(a));
    (r, (wall, cpu))
}

fn load(path: &std::path::Path, options: &LoadOptions) -> Qwen2Model {
    let (model, (wall, _)) = timed(|| Qwen2Model::load_with(path, &Device::Cpu, options).unwrap());
    let name = path.file_name().unwrap().to_string_lossy();
    println!("loaded {name} in {:.1} s", wall.as_secs_f64());
    model
}

/// Prefills `prompt` and returns the cache and the greedy next token.
fn prefill(model: &Qwen2Model, prompt: &[u32]) -> (KvCache, u32) {
    let mut cache = model.new_cache().unwrap();
    let (logits, sample) = timed(|| model.forward_block(prompt, &mut cache).unwrap());
    println!(
        "  prefill of {} tokens: {}",
        prompt.len(),
        Timing::of(&[sample]).show()
    );
    let next = qwen2_support::argmax_rows(&logits)[prompt.len() - 1];
    (cache, next)
}

/// A one-token step, decoding greedily.
fn decode_step(model: &Qwen2Model, cache: &mut KvCache, mut token: u32) -> Timing {
    let mut samples = Vec::new();
    for _ in 0..REPEATS {
        let (logits, sample) = timed(|| model.forward_block(&[token], cache).unwrap());
        samples.push(sample);
        token = qwen2_support::argmax_rows(&logits)[0];
    }
    Timing::of(&samples)
}

/// A `len`-token block, rolled back after each run.
fn block(model: &Qwen2Model, cache: &mut KvCache, len: usize) -> Timing {
    let tokens: Vec<u32> = (0..len as u32).map(|i| 1000 + 37 * i).collect();
    let keep = cache.len();
    let mut samples = Vec::new();
    for _ in 0..REPEATS {
        let (_, sample) = timed(|| model.forward_block(&tokens, cache).unwrap());
        samples.push(sample);
        cache.truncate(keep).unwrap();
    }
    Timing::of(&samples)
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
    let threads = specd_models::cpu::ThreadPool::global().threads();
    let kernels = specd_models::cpu::Isa::active().name();
    println!("Qwen2.5-Coder pair on CPU ({threads} threads, {kernels} kernels), median of {REPEATS} runs");

    let gguf = GgufFile::open(&target_path).unwrap();
    let tokenizer = GgufTokenizer::from_gguf_metadata(gguf.metadata()).unwrap();
    let template = ChatTemplate::from_gguf_metadata(gguf.metadata()).unwrap();
    let messages = [ChatMessage::user(
        "Write a Python function that checks whether a string is a palindrome.",
    )];
    let prompt = tokenizer
        .encode(&template.render(&messages, true).unwrap())
        .unwrap();

    let target = load(&target_path, &LoadOptions::default());
    let drafter = load(&drafter_path, &LoadOptions::default());

    let (mut target_cache, next) = prefill(&target, &prompt);
    let target_step = decode_step(&target, &mut target_cache, next);
    let (mut drafter_cache, next) = prefill(&drafter, &prompt);
    let drafter_step = decode_step(&drafter, &mut drafter_cache, next);

    println!("target decode step (1 token):  {}", target_step.show());
    println!(
        "drafter decode step (1 token): {}   drafter/target = {:.2}",
        drafter_step.show(),
        drafter_step.ratio(&target_step)
    );
    println!(
        "target verify block of K+1 tokens (context {} tokens):",
        target_cache.len()
    );
    for k in 1..=6 {
        let verify = block(&target, &mut target_cache, k + 1);
        let verify_ratio = verify.ratio(&target_step);
        // A round costs K drafter steps plus one verify; plain decoding costs one step a token.
        let round = k as f64 * drafter_step.ratio(&target_step) + verify_ratio;
        // Expected tokens a round yields: accepted drafts plus the target's own token.
        let tokens = (1.0 - ALPHA.powi(k as i32 + 1)) / (1.0 - ALPHA);
        println!(
            "  K={k}: {}   verify/step = {verify_ratio:.2}   round/step = {round:.2}   est. speed-up at alpha {ALPHA} = {:.2}",
            verify.show(),
            tokens / round
        );
    }

    if std::env::var("SPECD_BENCH_CANDLE").as_deref() == Ok("1") {
        drop((target, drafter));
        let candle = LoadOptions {
            backend: Backend::Candle,
            warm_up: true,
            ..LoadOptions::default()
        };
        for (name, path) in [("target", &target_path), ("drafter", &drafter_path)] {
            let model = load(path, &candle);
            let (mut cache, next) = prefill(&model, &prompt);
            let step = decode_step(&model, &mut cache, next);
            println!("{name} decode step on candle's kernels: {}", step.show());
            let verify = block(&model, &mut cache, 5);
            println!(
                "{name} verify of 5 tokens on candle's kernels: {}",
                verify.show()
            );
        }
    }
}
