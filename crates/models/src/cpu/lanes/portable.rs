//! The reference implementation of [`Lanes`] in plain Rust: correct on every CPU, and the
//! definition the vector implementations reproduce bit for bit.

use super::Lanes;

#[derive(Clone, Copy)]
pub(crate) struct Portable;

#[inline(always)]
fn map_b(b: [u8; 64], f: impl Fn(u8) -> u8) -> [u8; 64] {
    let mut out = [0u8; 64];
    for (o, x) in out.iter_mut().zip(b) {
        *o = f(x);
    }
    out
}

#[inline(always)]
fn zip_f(a: [f32; 16], b: [f32; 16], f: impl Fn(f32, f32) -> f32) -> [f32; 16] {
    let mut out = a;
    for c in 0..16 {
        out[c] = f(a[c], b[c]);
    }
    out
}

#[inline(always)]
unsafe fn read<const N: usize>(p: *const u8) -> [u8; N] {
    std::ptr::read_unaligned(p as *const [u8; N])
}

// SAFETY: plain Rust, no CPU feature needed; pointer arguments are read and written only
// for the bytes each method's contract names.
unsafe impl Lanes for Portable {
    type I = [i32; 16];
    type F = [f32; 16];
    type B = [u8; 64];

    const SIGNED_OFFSET: i32 = 0;

    #[inline(always)]
    unsafe fn load_b(p: *const u8) -> [u8; 64] {
        read::<64>(p)
    }
    #[inline(always)]
    unsafe fn nib_lo(b: [u8; 64]) -> [u8; 64] {
        map_b(b, |x| x & 0x0f)
    }
    #[inline(always)]
    unsafe fn nib_hi(b: [u8; 64]) -> [u8; 64] {
        map_b(b, |x| x >> 4)
    }
    #[inline(always)]
    unsafe fn shl_and<const S: u32>(b: [u8; 64], mask: u8) -> [u8; 64] {
        map_b(b, |x| (x << S) & mask)
    }
    #[inline(always)]
    unsafe fn shr_and<const S: u32>(b: [u8; 64], mask: u8) -> [u8; 64] {
        map_b(b, |x| (x >> S) & mask)
    }
    #[inline(always)]
    unsafe fn and_b(b: [u8; 64], mask: u8) -> [u8; 64] {
        map_b(b, |x| x & mask)
    }
    #[inline(always)]
    unsafe fn or_b(a: [u8; 64], b: [u8; 64]) -> [u8; 64] {
        let mut out = a;
        for (o, x) in out.iter_mut().zip(b) {
            *o |= x;
        }
        out
    }

    #[inline(always)]
    unsafe fn dot4(acc: [i32; 16], w: [u8; 64], y: i32) -> [i32; 16] {
        let y = y.to_le_bytes().map(|v| v as i8 as i32);
        let mut out = acc;
        for c in 0..16 {
            for t in 0..4 {
                out[c] += w[4 * c + t] as i32 * y[t];
            }
        }
        out
    }
    #[inline(always)]
    unsafe fn dot4_signed(acc: [i32; 16], w: [u8; 64], y: i32) -> [i32; 16] {
        let y = y.to_le_bytes().map(|v| v as i8 as i32);
        let mut out = acc;
        for c in 0..16 {
            for t in 0..4 {
                out[c] += w[4 * c + t] as i8 as i32 * y[t];
            }
        }
        out
    }

    #[inline(always)]
    unsafe fn zero_i() -> [i32; 16] {
        [0; 16]
    }
    #[inline(always)]
    unsafe fn add_i(a: [i32; 16], b: [i32; 16]) -> [i32; 16] {
        std::array::from_fn(|c| a[c].wrapping_add(b[c]))
    }
    #[inline(always)]
    unsafe fn splat_i(v: i32) -> [i32; 16] {
        [v; 16]
    }
    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> [i32; 16] {
        read::<16>(p).map(|x| x as i32)
    }

    #[inline(always)]
    unsafe fn load_u8_pairs(p: *const u8) -> [i32; 16] {
        let b = read::<32>(p);
        std::array::from_fn(|c| (b[2 * c] as u32 | ((b[2 * c + 1] as u32) << 16)) as i32)
    }
    #[inline(always)]
    unsafe fn load_i8_pairs(p: *const u8) -> [i32; 16] {
        let b = read::<32>(p);
        std::array::from_fn(|c| {
            let (lo, hi) = (
                b[2 * c] as i8 as i16 as u16,
                b[2 * c + 1] as i8 as i16 as u16,
            );
            (lo as u32 | ((hi as u32) << 16)) as i32
        })
    }
    #[inline(always)]
    unsafe fn low_i16(a: [i32; 16]) -> [i32; 16] {
        a.map(|x| x as i16 as i32)
    }
    #[inline(always)]
    unsafe fn high_i16(a: [i32; 16]) -> [i32; 16] {
        a.map(|x| x >> 16)
    }
    #[inline(always)]
    unsafe fn dot2(acc: [i32; 16], a: [i32; 16], b: i32) -> [i32; 16] {
        let (b0, b1) = (b as i16 as i32, b >> 16);
        let mut out = acc;
        for c in 0..16 {
            out[c] = out[c]
                .wrapping_add((a[c] as i16 as i32) * b0)
                .wrapping_add((a[c] >> 16) * b1);
        }
        out
    }

    #[inline(always)]
    unsafe fn cvt(a: [i32; 16]) -> [f32; 16] {
        a.map(|x| x as f32)
    }
    #[inline(always)]
    unsafe fn bits_f(a: [i32; 16]) -> [f32; 16] {
        a.map(|x| f32::from_bits(x as u32))
    }
    #[inline(always)]
    unsafe fn zero_f() -> [f32; 16] {
        [0.0; 16]
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> [f32; 16] {
        [v; 16]
    }
    #[inline(always)]
    unsafe fn add_f(a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        zip_f(a, b, |x, y| x + y)
    }
    #[inline(always)]
    unsafe fn sub_f(a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        zip_f(a, b, |x, y| x - y)
    }
    #[inline(always)]
    unsafe fn mul_f(a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        zip_f(a, b, |x, y| x * y)
    }
    #[inline(always)]
    unsafe fn fma_f(a: [f32; 16], b: [f32; 16], c: [f32; 16]) -> [f32; 16] {
        let mut out = c;
        for l in 0..16 {
            out[l] = a[l].mul_add(b[l], c[l]);
        }
        out
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> [f32; 16] {
        let raw = read::<32>(p);
        std::array::from_fn(|c| half::f16::from_le_bytes([raw[2 * c], raw[2 * c + 1]]).to_f32())
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> [f32; 16] {
        let raw = read::<32>(p);
        std::array::from_fn(|c| {
            f32::from_bits(u32::from(u16::from_le_bytes([raw[2 * c], raw[2 * c + 1]])) << 16)
        })
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const u8) -> [f32; 16] {
        let raw = read::<64>(p);
        std::array::from_fn(|c| {
            f32::from_le_bytes([raw[4 * c], raw[4 * c + 1], raw[4 * c + 2], raw[4 * c + 3]])
        })
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: [f32; 16]) {
        std::ptr::write_unaligned(p as *mut [f32; 16], v)
    }
}
