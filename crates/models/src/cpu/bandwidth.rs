//! The machine's memory read bandwidth, measured the way the kernels read weights: every
//! worker of the pool streams its share of a buffer much larger than the caches, held in
//! the same storage as packed weights (huge pages where the system offers them).
//!
//! A pass is timed twice, once with plain loads and once asking for the lines ahead as the
//! kernels do, and the faster counts: on a 2-core Xeon (family 6, model 207) the plain pass
//! read 8-13% less than the prefetching one, and a bandwidth floor taken from it made the
//! engine's use of the machine look better than it was.

use std::sync::atomic::{AtomicU64, Ordering};

use super::buffer::AlignedBytes;
use super::pool::ThreadPool;
#[cfg(target_arch = "x86_64")]
use super::tile::{L1_AHEAD, L2_AHEAD, L2_FAR_AHEAD};

/// Bytes read per measurement: far beyond any last-level cache a machine has today.
const BUFFER_BYTES: usize = 1 << 30;

/// A buffer of [`BUFFER_BYTES`], written once, to time passes over.
pub struct ReadPass {
    storage: AlignedBytes,
}

impl Default for ReadPass {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadPass {
    pub fn new() -> Self {
        let mut storage = AlignedBytes::zeroed(BUFFER_BYTES);
        for (i, word) in storage.as_mut_slice().chunks_exact_mut(8).enumerate() {
            word.copy_from_slice(&(i as u64).to_le_bytes());
        }
        Self { storage }
    }

    /// Bytes per second of one pass over the buffer by every worker of `pool`: the faster
    /// of a plain pass and one that asks for the lines ahead.
    pub fn run(&self, pool: &ThreadPool) -> f64 {
        let plain = self.pass(pool, false);
        let ahead = self.pass(pool, true);
        plain.max(ahead)
    }

    fn pass(&self, pool: &ThreadPool, ahead: bool) -> f64 {
        let words = BUFFER_BYTES / 8;
        // SAFETY: the storage is 64-byte aligned and `BUFFER_BYTES` long, a whole number of
        // initialised u64 words.
        let buffer: &[u64] = unsafe {
            std::slice::from_raw_parts(self.storage.as_slice().as_ptr() as *const u64, words)
        };
        let threads = pool.threads();
        let share = words.div_ceil(threads);
        let sink = AtomicU64::new(0);
        let elapsed = pool.run(&|w| {
            let part = &buffer[(w * share).min(words)..((w + 1) * share).min(words)];
            // Sixteen independent sums, vectorized as wide as the CPU allows, keep enough
            // loads in flight to saturate memory.
            let total = sum_words(part, ahead);
            sink.fetch_add(total, Ordering::Relaxed);
        });
        let seconds = elapsed.as_secs_f64();
        std::hint::black_box(sink.load(Ordering::Relaxed));
        BUFFER_BYTES as f64 / seconds
    }
}

/// The sum of `words`; with `ahead`, asking for lines ahead where the CPU takes hints.
#[cfg(target_arch = "x86_64")]
fn sum_words(words: &[u64], ahead: bool) -> u64 {
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 support was just checked.
        return unsafe { sum_words_avx2(words, ahead) };
    }
    sum_words_plain(words)
}

#[cfg(not(target_arch = "x86_64"))]
fn sum_words(words: &[u64], _ahead: bool) -> u64 {
    sum_words_plain(words)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_words_avx2(words: &[u64], ahead: bool) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    let chunks = words.chunks_exact(16);
    for chunk in chunks {
        let p = chunk.as_ptr() as *const __m256i;
        if ahead {
            // The kernels' hints (see `tile::Prefetch::OnceL2`), for two lines per chunk
            // of 128 bytes; a hint past the buffer's end is dropped, never dereferenced.
            let at = p as *const u8;
            for line in [0, 64] {
                _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(L2_AHEAD + line) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(L1_AHEAD + line) as *const i8);
                _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(L2_FAR_AHEAD + line) as *const i8);
            }
        }
        for (i, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_epi64(*a, _mm256_loadu_si256(p.add(i)));
        }
    }
    let mut lanes = [0u64; 4];
    let total = _mm256_add_epi64(
        _mm256_add_epi64(acc[0], acc[1]),
        _mm256_add_epi64(acc[2], acc[3]),
    );
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, total);
    lanes.iter().fold(0u64, |s, v| s.wrapping_add(*v))
}

fn sum_words_plain(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    for chunk in words.chunks_exact(8) {
        for (a, v) in acc.iter_mut().zip(chunk) {
            *a = a.wrapping_add(*v);
        }
    }
    acc.iter().fold(0u64, |s, a| s.wrapping_add(*a))
}
