//! [`Lanes`] on AVX2 with FMA and F16C: a tile row is two 256-bit halves (columns 0..8 and
//! 8..16); `vpmaddubsw` + `vpmaddwd` stand in for VNNI. Weight bytes stay below 64 (signed
//! weights go through the sign trick), so the 16-bit pair sums never saturate.
//!
//! With `VNNI` the dot products are AVX-VNNI's 256-bit `vpdpbusd` / `vpdpwssd` (Intel client
//! cores from Alder Lake on, which lack AVX-512): one instruction where plain AVX2 takes
//! three. The sums are exact either way, so both give the same bits.

use std::arch::x86_64::*;

use super::Lanes;

/// The AVX2 lanes; `VNNI` takes the dot products from AVX-VNNI, which the caller must
/// have enabled.
#[derive(Clone, Copy)]
pub(crate) struct Avx2<const VNNI: bool>;

pub(crate) fn supported() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// [`supported`] and AVX-VNNI.
pub(crate) fn vnni_supported() -> bool {
    supported() && is_x86_feature_detected!("avxvnni")
}

#[derive(Clone, Copy)]
pub(crate) struct Pair<T>([T; 2]);

#[inline(always)]
fn each<T: Copy, U>(a: Pair<T>, f: impl Fn(T) -> U) -> Pair<U> {
    Pair([f(a.0[0]), f(a.0[1])])
}

#[inline(always)]
fn both<T: Copy, U>(a: Pair<T>, b: Pair<T>, f: impl Fn(T, T) -> U) -> Pair<U> {
    Pair([f(a.0[0], b.0[0]), f(a.0[1], b.0[1])])
}

#[inline(always)]
unsafe fn pair_sum(acc: __m256i, w: __m256i, y: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(w, y);
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

// SAFETY: every method needs AVX2 and FMA (with VNNI, AVX-VNNI), which callers check through
// `Isa` before choosing this implementation; pointer arguments are read and written only
// for the bytes each method's contract names.
unsafe impl<const VNNI: bool> Lanes for Avx2<VNNI> {
    type I = Pair<__m256i>;
    type F = Pair<__m256>;
    type B = Pair<__m256i>;

    // `vpdpbusd` takes unsigned weights: signed bytes are flipped to `w + 128`.
    const SIGNED_OFFSET: i32 = if VNNI { 128 } else { 0 };

    #[inline(always)]
    unsafe fn load_b(p: *const u8) -> Self::B {
        Pair([
            _mm256_loadu_si256(p as *const __m256i),
            _mm256_loadu_si256(p.add(32) as *const __m256i),
        ])
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    #[inline(always)]
    unsafe fn prefetch_once(p: *const u8) {
        _mm_prefetch::<_MM_HINT_NTA>(p as *const i8)
    }
    #[inline(always)]
    unsafe fn prefetch_l2(p: *const u8) {
        _mm_prefetch::<_MM_HINT_T1>(p as *const i8)
    }
    #[inline(always)]
    unsafe fn nib_lo(b: Self::B) -> Self::B {
        each(b, |x| _mm256_and_si256(x, _mm256_set1_epi8(0x0f)))
    }
    #[inline(always)]
    unsafe fn nib_hi(b: Self::B) -> Self::B {
        each(b, |x| {
            _mm256_and_si256(_mm256_srli_epi16::<4>(x), _mm256_set1_epi8(0x0f))
        })
    }
    #[inline(always)]
    unsafe fn shl_and<const S: u32>(b: Self::B, mask: u8) -> Self::B {
        let count = _mm_cvtsi32_si128(S as i32);
        each(b, |x| {
            _mm256_and_si256(_mm256_sll_epi16(x, count), _mm256_set1_epi8(mask as i8))
        })
    }
    #[inline(always)]
    unsafe fn shr_and<const S: u32>(b: Self::B, mask: u8) -> Self::B {
        let count = _mm_cvtsi32_si128(S as i32);
        each(b, |x| {
            _mm256_and_si256(_mm256_srl_epi16(x, count), _mm256_set1_epi8(mask as i8))
        })
    }
    #[inline(always)]
    unsafe fn and_b(b: Self::B, mask: u8) -> Self::B {
        each(b, |x| _mm256_and_si256(x, _mm256_set1_epi8(mask as i8)))
    }
    #[inline(always)]
    unsafe fn or_b(a: Self::B, b: Self::B) -> Self::B {
        both(a, b, |x, y| _mm256_or_si256(x, y))
    }

    #[inline(always)]
    unsafe fn dot4(acc: Self::I, w: Self::B, y: i32) -> Self::I {
        let y = _mm256_set1_epi32(y);
        if VNNI {
            both(acc, w, |a, w| _mm256_dpbusd_avx_epi32(a, w, y))
        } else {
            both(acc, w, |a, w| pair_sum(a, w, y))
        }
    }
    #[inline(always)]
    unsafe fn dot4_signed(acc: Self::I, w: Self::B, y: i32) -> Self::I {
        let y = _mm256_set1_epi32(y);
        if VNNI {
            let flip = _mm256_set1_epi8(-128);
            both(acc, w, |a, w| {
                _mm256_dpbusd_avx_epi32(a, _mm256_xor_si256(w, flip), y)
            })
        } else {
            both(acc, w, |a, w| {
                pair_sum(a, _mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w))
            })
        }
    }

    /// Without VNNI every dot product is a `vpmaddubsw` (pair sums in 16 bits) and a
    /// `vpmaddwd` by ones (to 32 bits): as many of a run's groups as cannot overflow 16 bits
    /// (8 for 4-bit weights, 4 for 5-bit, 2 for 6-bit) have their pair sums added with
    /// `vpaddw` first and widened once, which takes most of the multiplies and 32-bit adds
    /// out of a pass over several rows, where the arithmetic and not the weight stream is
    /// what a pass waits for.
    #[inline(always)]
    unsafe fn dot4_run(acc: Self::I, w: &[Self::B], y: *const i8, weight_bits: u32) -> Self::I {
        let at = |g: usize| _mm256_set1_epi32(std::ptr::read_unaligned(y.add(4 * g) as *const i32));
        if VNNI {
            let mut chains = [acc, Self::zero_i()];
            for (g, wg) in w.iter().enumerate() {
                let yg = at(g);
                chains[g % 2] = both(chains[g % 2], *wg, |a, w| _mm256_dpbusd_avx_epi32(a, w, yg));
            }
            return Self::add_i(chains[0], chains[1]);
        }
        // Each pair sum is below 2 * 2^weight_bits * 128 in magnitude.
        let pair_bound = 2 * ((1usize << weight_bits) - 1) * 128;
        let per = (i16::MAX as usize / pair_bound).max(1);
        let ones = _mm256_set1_epi16(1);
        let mut acc = acc;
        for (c, chunk) in w.chunks(per).enumerate() {
            let first = per * c;
            let y0 = at(first);
            let mut pairs = each(chunk[0], |w| _mm256_maddubs_epi16(w, y0));
            for (g, wg) in chunk.iter().enumerate().skip(1) {
                let yg = at(first + g);
                pairs = both(pairs, *wg, |p, w| {
                    _mm256_add_epi16(p, _mm256_maddubs_epi16(w, yg))
                });
            }
            acc = both(acc, pairs, |a, p| {
                _mm256_add_epi32(a, _mm256_madd_epi16(p, ones))
            });
        }
        acc
    }

    #[inline(always)]
    unsafe fn zero_i() -> Self::I {
        Pair([_mm256_setzero_si256(); 2])
    }
    #[inline(always)]
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I {
        both(a, b, |x, y| _mm256_add_epi32(x, y))
    }
    #[inline(always)]
    unsafe fn splat_i(v: i32) -> Self::I {
        Pair([_mm256_set1_epi32(v); 2])
    }
    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> Self::I {
        Pair([
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)),
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8) as *const __m128i)),
        ])
    }

    #[inline(always)]
    unsafe fn load_u8_pairs(p: *const u8) -> Self::I {
        Pair([
            _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i)),
            _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16) as *const __m128i)),
        ])
    }
    #[inline(always)]
    unsafe fn load_i8_pairs(p: *const u8) -> Self::I {
        Pair([
            _mm256_cvtepi8_epi16(_mm_loadu_si128(p as *const __m128i)),
            _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(16) as *const __m128i)),
        ])
    }
    #[inline(always)]
    unsafe fn low_i16(a: Self::I) -> Self::I {
        each(a, |x| _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(x)))
    }
    #[inline(always)]
    unsafe fn high_i16(a: Self::I) -> Self::I {
        each(a, |x| _mm256_srai_epi32::<16>(x))
    }
    #[inline(always)]
    unsafe fn dot2(acc: Self::I, a: Self::I, b: i32) -> Self::I {
        let b = _mm256_set1_epi32(b);
        if VNNI {
            both(acc, a, |s, x| _mm256_dpwssd_avx_epi32(s, x, b))
        } else {
            both(acc, a, |s, x| _mm256_add_epi32(s, _mm256_madd_epi16(x, b)))
        }
    }

    #[inline(always)]
    unsafe fn cvt(a: Self::I) -> Self::F {
        each(a, |x| _mm256_cvtepi32_ps(x))
    }
    #[inline(always)]
    unsafe fn bits_f(a: Self::I) -> Self::F {
        each(a, |x| _mm256_castsi256_ps(x))
    }
    #[inline(always)]
    unsafe fn zero_f() -> Self::F {
        Pair([_mm256_setzero_ps(); 2])
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> Self::F {
        Pair([_mm256_set1_ps(v); 2])
    }
    #[inline(always)]
    unsafe fn add_f(a: Self::F, b: Self::F) -> Self::F {
        both(a, b, |x, y| _mm256_add_ps(x, y))
    }
    #[inline(always)]
    unsafe fn sub_f(a: Self::F, b: Self::F) -> Self::F {
        both(a, b, |x, y| _mm256_sub_ps(x, y))
    }
    #[inline(always)]
    unsafe fn mul_f(a: Self::F, b: Self::F) -> Self::F {
        both(a, b, |x, y| _mm256_mul_ps(x, y))
    }
    #[inline(always)]
    unsafe fn fma_f(a: Self::F, b: Self::F, c: Self::F) -> Self::F {
        Pair([
            _mm256_fmadd_ps(a.0[0], b.0[0], c.0[0]),
            _mm256_fmadd_ps(a.0[1], b.0[1], c.0[1]),
        ])
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> Self::F {
        Pair([
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i)),
        ])
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> Self::F {
        let half = |q: *const u8| {
            let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(q as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
        };
        Pair([half(p), half(p.add(16))])
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const u8) -> Self::F {
        Pair([
            _mm256_loadu_ps(p as *const f32),
            _mm256_loadu_ps(p.add(32) as *const f32),
        ])
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: Self::F) {
        _mm256_storeu_ps(p, v.0[0]);
        _mm256_storeu_ps(p.add(8), v.0[1]);
    }
}
