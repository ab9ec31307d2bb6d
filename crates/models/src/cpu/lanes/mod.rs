//! Sixteen output columns of a weight tile, as every kernel sees them.
//!
//! A tile interleaves 16 output columns so that vector lane `c` always belongs to column `c`:
//! a kernel never reduces across lanes, and every output element is computed by one fixed
//! sequence of operations (exact integer sums, then the same float multiply-adds in the same
//! order). The three implementations below (AVX-512 VNNI, AVX2, portable) therefore give the
//! same bits, and the kernels are written once, generically, over this trait.
//!
//! Every method is `#[inline(always)]`: the kernels are instantiated inside functions that
//! enable the matching CPU features, and the intrinsics inline into them.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod portable;

/// The operations the tile kernels need, over 16 columns at a time.
///
/// # Safety
/// Implementations use CPU features that the caller must have checked, and raw pointers
/// that must be valid for the bytes each method names.
pub(crate) unsafe trait Lanes {
    /// 16 x i32.
    type I: Copy;
    /// 16 x f32.
    type F: Copy;
    /// 64 bytes: 4 consecutive reduction bytes of each of the 16 columns.
    type B: Copy;

    /// Added to every dot product of [`Lanes::dot4_signed`] times the sum of the activation
    /// bytes; the kernel subtracts it per block (0 where the dot is computed directly).
    const SIGNED_OFFSET: i32;

    unsafe fn load_b(p: *const u8) -> Self::B;
    /// A hint to bring the 64-byte line at `p` into the cache (may do nothing).
    #[inline(always)]
    unsafe fn prefetch(_p: *const u8) {}
    /// A hint to bring the 64-byte line at `p` close for a single use, without displacing
    /// cached data (may do nothing).
    #[inline(always)]
    unsafe fn prefetch_once(_p: *const u8) {}
    /// A hint to bring the 64-byte line at `p` into the second-level cache, not the first
    /// (may do nothing).
    #[inline(always)]
    unsafe fn prefetch_l2(_p: *const u8) {}
    /// `b & 0x0f` per byte.
    unsafe fn nib_lo(b: Self::B) -> Self::B;
    /// `b >> 4` per byte.
    unsafe fn nib_hi(b: Self::B) -> Self::B;
    /// `(b << S) & mask` per byte, for `S <= 4` and masks clear of bits `0..S`.
    unsafe fn shl_and<const S: u32>(b: Self::B, mask: u8) -> Self::B;
    /// `(b >> S) & mask` per byte, for masks clear of bits `8 - S..8`.
    unsafe fn shr_and<const S: u32>(b: Self::B, mask: u8) -> Self::B;
    unsafe fn and_b(b: Self::B, mask: u8) -> Self::B;
    unsafe fn or_b(a: Self::B, b: Self::B) -> Self::B;

    /// `acc[c] + sum_t w[c][t] * y[t]` for unsigned weight bytes below 64 and the four
    /// signed activation bytes packed in `y`.
    unsafe fn dot4(acc: Self::I, w: Self::B, y: i32) -> Self::I;
    /// Like `dot4` for signed weight bytes, plus `SIGNED_OFFSET * sum_t y[t]`.
    unsafe fn dot4_signed(acc: Self::I, w: Self::B, y: i32) -> Self::I;
    /// `acc + sum_g dot4(w[g], y[4g..4g + 4])` over the groups `w`, whose weight bytes are
    /// below `2^weight_bits`, with the signed activation bytes at `y`.
    ///
    /// The sum is exact, so a set may add the products in whatever order is cheapest; here
    /// even and odd groups go to two chains added at the end (one chain of eight dependent
    /// dot products waits out eight of their latencies: on a 2-core Xeon, family 6, model
    /// 207, two made verifies of 5 and 8 rows 0.985x and 0.92x as long, paired in one
    /// process, and left a decode step unchanged).
    #[inline(always)]
    unsafe fn dot4_run(acc: Self::I, w: &[Self::B], y: *const i8, weight_bits: u32) -> Self::I {
        let _ = weight_bits;
        let mut chains = [acc, Self::zero_i()];
        for (g, wg) in w.iter().enumerate() {
            let yg = std::ptr::read_unaligned(y.add(4 * g) as *const i32);
            chains[g % 2] = Self::dot4(chains[g % 2], *wg, yg);
        }
        Self::add_i(chains[0], chains[1])
    }

    unsafe fn zero_i() -> Self::I;
    /// `a + b` per lane (wrapping).
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn splat_i(v: i32) -> Self::I;
    /// 16 unsigned bytes, widened.
    unsafe fn load_u8(p: *const u8) -> Self::I;
    /// 32 unsigned bytes as 16 lanes of two i16 (byte `2c` low, byte `2c + 1` high).
    unsafe fn load_u8_pairs(p: *const u8) -> Self::I;
    /// 32 signed bytes as 16 lanes of two i16.
    unsafe fn load_i8_pairs(p: *const u8) -> Self::I;
    /// The low i16 of each lane, sign-extended.
    unsafe fn low_i16(a: Self::I) -> Self::I;
    /// The high i16 of each lane, sign-extended.
    unsafe fn high_i16(a: Self::I) -> Self::I;
    /// `acc + a.low * b.low + a.high * b.high` per lane, with `b`'s two i16 packed in one i32.
    unsafe fn dot2(acc: Self::I, a: Self::I, b: i32) -> Self::I;

    unsafe fn cvt(a: Self::I) -> Self::F;
    /// Each lane's 32 bits read as an f32.
    unsafe fn bits_f(a: Self::I) -> Self::F;
    unsafe fn zero_f() -> Self::F;
    unsafe fn splat_f(v: f32) -> Self::F;
    unsafe fn add_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn sub_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn mul_f(a: Self::F, b: Self::F) -> Self::F;
    /// `a * b + c` with one rounding.
    unsafe fn fma_f(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// 16 little-endian f16 values.
    unsafe fn load_f16(p: *const u8) -> Self::F;
    /// 16 little-endian bf16 values.
    unsafe fn load_bf16(p: *const u8) -> Self::F;
    /// 16 little-endian f32 values.
    unsafe fn load_f32(p: *const u8) -> Self::F;
    unsafe fn store_f(p: *mut f32, v: Self::F);
}
