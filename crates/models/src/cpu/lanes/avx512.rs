//! [`Lanes`] on AVX-512 with VNNI: one 512-bit register holds a whole tile row, and
//! `vpdpbusd` multiplies four weight bytes by four activation bytes per lane.

use std::arch::x86_64::*;

use super::Lanes;

#[derive(Clone, Copy)]
pub(crate) struct Avx512;

/// The CPU features the AVX-512 kernels are compiled for.
pub(crate) fn supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

// SAFETY: every method needs the features `supported` checks, which callers check through
// `Isa` before choosing this implementation; pointer arguments are read and written only
// for the bytes each method's contract names.
unsafe impl Lanes for Avx512 {
    type I = __m512i;
    type F = __m512;
    type B = __m512i;

    // `vpdpbusd` takes unsigned weights: signed bytes are flipped to `w + 128`.
    const SIGNED_OFFSET: i32 = 128;

    #[inline(always)]
    unsafe fn load_b(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p as *const __m512i)
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
    unsafe fn nib_lo(b: __m512i) -> __m512i {
        _mm512_and_si512(b, _mm512_set1_epi8(0x0f))
    }
    #[inline(always)]
    unsafe fn nib_hi(b: __m512i) -> __m512i {
        _mm512_and_si512(_mm512_srli_epi16::<4>(b), _mm512_set1_epi8(0x0f))
    }
    #[inline(always)]
    unsafe fn shl_and<const S: u32>(b: __m512i, mask: u8) -> __m512i {
        _mm512_and_si512(_mm512_slli_epi16::<S>(b), _mm512_set1_epi8(mask as i8))
    }
    #[inline(always)]
    unsafe fn shr_and<const S: u32>(b: __m512i, mask: u8) -> __m512i {
        _mm512_and_si512(_mm512_srli_epi16::<S>(b), _mm512_set1_epi8(mask as i8))
    }
    #[inline(always)]
    unsafe fn and_b(b: __m512i, mask: u8) -> __m512i {
        _mm512_and_si512(b, _mm512_set1_epi8(mask as i8))
    }
    #[inline(always)]
    unsafe fn or_b(a: __m512i, b: __m512i) -> __m512i {
        _mm512_or_si512(a, b)
    }

    #[inline(always)]
    unsafe fn dot4(acc: __m512i, w: __m512i, y: i32) -> __m512i {
        _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(y))
    }
    #[inline(always)]
    unsafe fn dot4_signed(acc: __m512i, w: __m512i, y: i32) -> __m512i {
        let flipped = _mm512_xor_si512(w, _mm512_set1_epi8(-128));
        _mm512_dpbusd_epi32(acc, flipped, _mm512_set1_epi32(y))
    }

    #[inline(always)]
    unsafe fn zero_i() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn add_i(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn splat_i(v: i32) -> __m512i {
        _mm512_set1_epi32(v)
    }
    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> __m512i {
        _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))
    }

    #[inline(always)]
    unsafe fn load_u8_pairs(p: *const u8) -> __m512i {
        _mm512_cvtepu8_epi16(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn load_i8_pairs(p: *const u8) -> __m512i {
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn low_i16(a: __m512i) -> __m512i {
        _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(a))
    }
    #[inline(always)]
    unsafe fn high_i16(a: __m512i) -> __m512i {
        _mm512_srai_epi32::<16>(a)
    }
    #[inline(always)]
    unsafe fn dot2(acc: __m512i, a: __m512i, b: i32) -> __m512i {
        _mm512_dpwssd_epi32(acc, a, _mm512_set1_epi32(b))
    }

    #[inline(always)]
    unsafe fn cvt(a: __m512i) -> __m512 {
        _mm512_cvtepi32_ps(a)
    }
    #[inline(always)]
    unsafe fn bits_f(a: __m512i) -> __m512 {
        _mm512_castsi512_ps(a)
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m512 {
        _mm512_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn add_f(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub_f(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul_f(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fma_f(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> __m512 {
        let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const u8) -> __m512 {
        _mm512_loadu_ps(p as *const f32)
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
}
