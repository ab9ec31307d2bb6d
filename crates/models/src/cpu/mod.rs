//! The CPU engine's kernels: quantized weights repacked into tiles at load, one matmul
//! kernel for 1..any input rows, and the per-row operations of a decoder layer.
//!
//! Speculative decoding is lossless only if a token's logits are the same whether it is
//! decoded alone, verified inside a block, batched beside other sequences or prefilled in a
//! chunk. Every output element here is computed by one fixed sequence of operations:
//! integer dot products (exact, so their order is free), then float multiply-adds in a fixed
//! order; work is split between threads only along output columns, never along a reduction.
//! The AVX-512 VNNI, AVX2 and portable kernels (chosen at run time, see [`Isa`]) give the
//! same bits.

mod activation;
mod attention;
mod bandwidth;
mod buffer;
mod format;
mod formats;
mod isa;
mod kv;
mod lanes;
mod matmul;
pub mod ops;
mod pack;
mod pool;
mod streaming;
mod tile;

#[cfg(test)]
mod tests;

pub use activation::QuantizedRows;
pub use attention::{attend, attend_trees, Heads, Span};
pub use bandwidth::ReadPass;
pub use format::{dequantize_row, ActivationKind, WeightFormat};
pub(crate) use isa::{avx2_kernel, avx512_kernel};
pub use isa::{Isa, KERNELS_ENV};
pub use kv::KvBuffers;
pub use matmul::{run as matmul, LayerInput, Output, Task, MAX_TASKS};
pub use pack::{PackError, PackedMatrix, TILE};
pub use pool::{ThreadPool, THREADS_ENV};
pub use streaming::{prefetch_hint, PREFETCH_ENV};

/// Runs `f` compiled for `isa`'s features, so the element-wise loops inlined into it use
/// them (fused multiply-adds in hardware, wide vectors).
#[inline(always)]
pub fn with_isa<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` is only ever a supported set (see `Isa::detect`).
        Isa::Avx512Vnni if isa.supported() => unsafe { run_avx512(f) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above; the guard checked the features.
        Isa::AvxVnni | Isa::Avx2 if isa.supported() => unsafe { run_avx2(f) },
        _ => f(),
    }
}

avx512_kernel! {
    unsafe fn run_avx512<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

avx2_kernel! {
    unsafe fn run_avx2<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}
