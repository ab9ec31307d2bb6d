//! What the Gemma 4 benchmarks share: the medium checkpoint they load, the sample count, the
//! median timer and the prompt ids.

use std::path::PathBuf;
use std::time::Instant;

/// The medium random checkpoint of tools/bench_torch_gemma4.py (`SPECD_BENCH_GEMMA4_DIR`,
/// default /tmp/gemma4-medium; a `gemma4` GGUF file of it also loads), or `None` after saying
/// how to make it.
pub fn medium_checkpoint() -> Option<PathBuf> {
    let dir = PathBuf::from(
        std::env::var("SPECD_BENCH_GEMMA4_DIR").unwrap_or_else(|_| "/tmp/gemma4-medium".into()),
    );
    if dir.is_file() || dir.join("config.json").exists() {
        return Some(dir);
    }
    eprintln!(
        "no checkpoint in {}: run tools/bench_gemma4.sh (or tools/bench_torch_gemma4.py {}) first",
        dir.display(),
        dir.display()
    );
    None
}

/// Samples per median (`SPECD_BENCH_RUNS`).
pub fn runs(default: usize) -> usize {
    std::env::var("SPECD_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Median wall time of `runs` calls in milliseconds, after one warm-up call.
pub fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut samples: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Deterministic pseudo-random token ids in `[3, vocab)`.
pub fn ids(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            3 + ((x >> 33) as usize % (vocab - 3)) as u32
        })
        .collect()
}
