//! The instruction set the kernels run with, chosen at run time.

use super::activation::ActRow;
use super::format::WeightFormat;
use super::lanes::portable::Portable;
use super::tile::{run_rows, Prefetch, MAX_ROWS};

/// Compiles the function that follows with AVX-512 VNNI's CPU features, the one list of
/// them (x86-64 builds only). Call it only where [`Isa::Avx512Vnni`] is supported.
macro_rules! avx512_kernel {
    ($($item:tt)*) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        $($item)*
    };
}

/// As [`avx512_kernel`], for [`Isa::AvxVnni`].
macro_rules! avx_vnni_kernel {
    ($($item:tt)*) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        $($item)*
    };
}

/// As [`avx512_kernel`], for [`Isa::Avx2`] (whose features every x86 set but the portable
/// one includes).
macro_rules! avx2_kernel {
    ($($item:tt)*) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,f16c")]
        $($item)*
    };
}

pub(crate) use {avx2_kernel, avx512_kernel};

/// The environment variable that forces a kernel set (`avx512`, `avx-vnni`, `avx2` or
/// `portable`); a set the CPU lacks falls back to the best one it has.
pub const KERNELS_ENV: &str = "SPECD_CPU_KERNELS";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// AVX-512 F/BW/VL with VNNI, FMA and F16C.
    Avx512Vnni,
    /// AVX2 with AVX-VNNI (256-bit VNNI), FMA and F16C: Intel client cores without AVX-512.
    AvxVnni,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// Plain Rust, on every CPU.
    Portable,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Self::Avx512Vnni => "avx512-vnni",
            Self::AvxVnni => "avx-vnni",
            Self::Avx2 => "avx2",
            Self::Portable => "portable",
        }
    }

    pub fn supported(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Vnni => super::lanes::avx512::supported(),
            #[cfg(target_arch = "x86_64")]
            Self::AvxVnni => super::lanes::avx2::vnni_supported(),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => super::lanes::avx2::supported(),
            Self::Portable => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every kernel set this CPU can run, best first.
    pub fn available() -> Vec<Isa> {
        [Self::Avx512Vnni, Self::AvxVnni, Self::Avx2, Self::Portable]
            .into_iter()
            .filter(|i| i.supported())
            .collect()
    }

    /// The best supported set, or the one `SPECD_CPU_KERNELS` names.
    pub fn detect() -> Isa {
        let best = Self::available()[0];
        let Ok(wanted) = std::env::var(KERNELS_ENV) else {
            return best;
        };
        let named = match wanted.trim() {
            "avx512" | "avx512-vnni" => Some(Self::Avx512Vnni),
            "avx-vnni" | "avxvnni" => Some(Self::AvxVnni),
            "avx2" => Some(Self::Avx2),
            "portable" => Some(Self::Portable),
            _ => None,
        };
        match named {
            Some(isa) if isa.supported() => isa,
            _ => {
                tracing::warn!(
                    variable = KERNELS_ENV,
                    value = %wanted,
                    using = best.name(),
                    "kernel set unknown or not supported by this CPU"
                );
                best
            }
        }
    }

    /// The process-wide choice, made once.
    pub fn active() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            let isa = Self::detect();
            tracing::info!(kernels = isa.name(), "CPU kernel set");
            isa
        })
    }

    /// One pass over a gate tile and the matching up tile for 1..=8 rows, writing
    /// `silu(gate) * up` (the SwiGLU of an MLP) into `out`; `together` reads both tiles
    /// side by side (two streams) where their formats match, else one after the other.
    ///
    /// # Safety
    /// As [`Isa::run_tiles`], for each tile with its own format and block count (both
    /// formats read the same activation rows).
    pub(crate) unsafe fn run_swiglu_tile(
        self,
        tiles: [(WeightFormat, *const u8, usize); 2],
        rows: &[ActRow],
        out: &mut [[f32; 16]; MAX_ROWS],
        prefetch: Prefetch,
        together: bool,
    ) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Vnni => swiglu_avx512(tiles, rows, out, prefetch, together),
            #[cfg(target_arch = "x86_64")]
            Self::AvxVnni => swiglu_avx_vnni(tiles, rows, out, prefetch, together),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => swiglu_avx2(tiles, rows, out, prefetch, together),
            _ => swiglu::<Portable>(tiles, rows, out, prefetch, together),
        }
    }

    /// One pass over one tile, or over two tiles of the same format and length at once,
    /// for 1..=8 rows; `out[t][r]` gets tile `t`, row `r`.
    ///
    /// # Safety
    /// `self` must be supported; each tile must hold `blocks` blocks of `format`; each
    /// row's pointers must cover the reduction length.
    pub(crate) unsafe fn run_tiles(
        self,
        format: WeightFormat,
        tiles: &[*const u8],
        blocks: usize,
        rows: &[ActRow],
        out: &mut [[[f32; 16]; MAX_ROWS]],
        prefetch: Prefetch,
    ) {
        debug_assert!(matches!(tiles.len(), 1 | 2) && out.len() >= tiles.len());
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Vnni => tile_avx512(format, tiles, blocks, rows, out, prefetch),
            #[cfg(target_arch = "x86_64")]
            Self::AvxVnni => tile_avx_vnni(format, tiles, blocks, rows, out, prefetch),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => tile_avx2(format, tiles, blocks, rows, out, prefetch),
            _ => run_rows::<Portable>(format, tiles, blocks, rows, out, prefetch),
        }
    }
}

/// Gate and up tiles (side by side if `together` and they match), then `silu(gate) * up`.
#[inline(always)]
unsafe fn swiglu<L: super::lanes::Lanes>(
    tiles: [(WeightFormat, *const u8, usize); 2],
    rows: &[ActRow],
    out: &mut [[f32; 16]; MAX_ROWS],
    prefetch: Prefetch,
    together: bool,
) {
    let mut both = [[[0f32; 16]; MAX_ROWS]; 2];
    let [(gate_format, gate, gate_blocks), (up_format, up, up_blocks)] = tiles;
    if together && (gate_format, gate_blocks) == (up_format, up_blocks) {
        run_rows::<L>(
            gate_format,
            &[gate, up],
            gate_blocks,
            rows,
            &mut both,
            prefetch,
        );
    } else {
        run_rows::<L>(
            gate_format,
            &[gate],
            gate_blocks,
            rows,
            &mut both[..1],
            prefetch,
        );
        run_rows::<L>(up_format, &[up], up_blocks, rows, &mut both[1..], prefetch);
    }
    let [gates, ups] = &both;
    for ((out, gate), up) in out.iter_mut().zip(gates).zip(ups).take(rows.len()) {
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = *g / (1.0 + super::ops::exp(-*g)) * u;
        }
    }
}

/// A kernel set's two entry points, `$tile` ([`run_rows`]) and `$swiglu` ([`swiglu`]) over
/// `$lanes`, compiled by `$set` (the set's macro above, with its one list of CPU features).
macro_rules! kernel_entries {
    ($tile:ident, $swiglu:ident, $set:ident, $lanes:ty) => {
        $set! {
        unsafe fn $tile(
            format: WeightFormat,
            tiles: &[*const u8],
            blocks: usize,
            rows: &[ActRow],
            out: &mut [[[f32; 16]; MAX_ROWS]],
            prefetch: Prefetch,
        ) {
            run_rows::<$lanes>(format, tiles, blocks, rows, out, prefetch)
        }
        }

        $set! {
        unsafe fn $swiglu(
            tiles: [(WeightFormat, *const u8, usize); 2],
            rows: &[ActRow],
            out: &mut [[f32; 16]; MAX_ROWS],
            prefetch: Prefetch,
            together: bool,
        ) {
            swiglu::<$lanes>(tiles, rows, out, prefetch, together)
        }
        }
    };
}

kernel_entries!(
    tile_avx512,
    swiglu_avx512,
    avx512_kernel,
    super::lanes::avx512::Avx512
);
kernel_entries!(
    tile_avx_vnni,
    swiglu_avx_vnni,
    avx_vnni_kernel,
    super::lanes::avx2::Avx2<true>
);
kernel_entries!(
    tile_avx2,
    swiglu_avx2,
    avx2_kernel,
    super::lanes::avx2::Avx2<false>
);
