//! The tile kernels: 16 output columns of one packed weight (or of two tiles read side by
//! side) times up to [`MAX_ROWS`] input rows, written once over [`Lanes`] and instantiated
//! per instruction set.
//!
//! Per output element the work is fixed: exact integer dot products per block (and per
//! sub-block of the K-quants, whose scaled sums are added in order as floats), then per
//! block one or two float multiply-adds into the accumulator, blocks in order. The number of
//! rows in a pass only decides how often a weight chunk, once unpacked, is reused, and a
//! second tile only interleaves its own, independent, accumulators.
//!
//! Integer sums become floats without a conversion: a dot product is started from the bits
//! of [`FLOAT_BIAS`], so its result reads as the float `FLOAT_BIAS + sum`. On AVX-512 Xeons
//! conversions and integer multiplies run on the one port that also runs every `vpdpbusd`,
//! while float adds and multiply-adds have a second; scaling a K-quant sub-block in floats
//! instead made a verify of 5 rows on a 2-core Xeon 3% faster and a 1-thread prefill 10%.

use super::activation::ActRow;
use super::format::WeightFormat;
use super::lanes::Lanes;

/// Input rows one pass over a tile serves.
pub const MAX_ROWS: usize = 8;

/// How a pass over a tile asks for the weight lines ahead of the block it reads: the
/// hardware streamers alone leave a single-row pass about 25% below the machine's read
/// bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prefetch {
    /// One pass serves every row, so each line is used once: asked for 6 KiB ahead as
    /// non-temporal, which keeps the caches for activations and lets more lines be in
    /// flight. On a 2-core Zen 5 a decode step of the 1.5B target (one stream per worker)
    /// was 6% faster at 4 KiB than with `Reuse`, and 5-12% faster again at 6 KiB; 2, 3,
    /// 5, 7, 8, 12 and 16 KiB were no better.
    Once,
    /// Each line used once, asked for [`L2_AHEAD`] (6 KiB) ahead into the second-level
    /// cache and again [`L1_AHEAD`] (3 KiB) ahead into the first. On a 2-core Xeon (family
    /// 6, model 207) non-temporal lines starved the cores: a decode step took 1.45x (1.5B
    /// target) and 1.59x (0.5B drafter) as long as with the second-level hint alone, which
    /// was 2-3% slower at 3 and 24 KiB and no better at 12; first-level hints alone were
    /// 4-8% slower. Both hints together made the steps 0.89-0.91x (target) and 0.91-0.94x
    /// (drafter) as long as the second-level hint alone (paired in one process); a
    /// first-level distance of 2 KiB did about as well, 0.5-1 KiB less, and second-level
    /// distances of 8 and 12 KiB did not change it. Work between the loads slows the stream
    /// the second-level hint alone keeps up: a prefetching read pass lost 10-13% with two
    /// `vpdpbusd` per line added, and got about half of that back with the first-level
    /// hint. A third hint, second-level at [`L2_FAR_AHEAD`] (16 KiB), made the target's
    /// steps 0.96-0.99x as long again and left the drafter's and the prefetching read
    /// pass's unchanged (24 and 32 KiB did about as well). Which hint a machine wants is
    /// measured at run time (see [`super::streaming`]).
    OnceL2,
    /// Later groups of rows read the tile again: asked for 2 KiB ahead into the caches.
    Reuse,
}

/// How far ahead [`Prefetch::OnceL2`] asks for lines into the second-level cache; the read
/// pass that measures the machine's bandwidth asks the same.
pub(crate) const L2_AHEAD: usize = 6144;
/// How far ahead [`Prefetch::OnceL2`] asks for lines into the first-level cache (and the
/// read pass with it).
pub(crate) const L1_AHEAD: usize = 3072;
/// A second, farther second-level hint of [`Prefetch::OnceL2`] (and the read pass).
pub(crate) const L2_FAR_AHEAD: usize = 16384;

/// Asks for the lines a prefetch distance past `p..p + len`.
#[inline(always)]
unsafe fn ahead<L: Lanes>(prefetch: Prefetch, p: *const u8, len: usize) {
    let mut off = 0;
    match prefetch {
        Prefetch::Once => {
            while off < len {
                L::prefetch_once(p.wrapping_add(6144 + off));
                off += 64;
            }
        }
        Prefetch::OnceL2 => {
            while off < len {
                L::prefetch_l2(p.wrapping_add(L2_AHEAD + off));
                L::prefetch(p.wrapping_add(L1_AHEAD + off));
                L::prefetch_l2(p.wrapping_add(L2_FAR_AHEAD + off));
                off += 64;
            }
        }
        Prefetch::Reuse => {
            while off < len {
                L::prefetch(p.wrapping_add(2048 + off));
                off += 64;
            }
        }
    }
}

#[inline(always)]
unsafe fn y4(row: &ActRow, at: usize) -> i32 {
    std::ptr::read_unaligned(row.q.add(at) as *const i32)
}

#[inline(always)]
unsafe fn sum32(row: &ActRow, block32: usize) -> i32 {
    *row.sums16.add(2 * block32) + *row.sums16.add(2 * block32 + 1)
}

/// The 8 groups of 4 values of a 32-value nibble span (chunk `h`: groups `h` and `h + 4`).
#[inline(always)]
unsafe fn nibble_groups<L: Lanes>(p: *const u8) -> [L::B; 8] {
    let c = [
        L::load_b(p),
        L::load_b(p.add(64)),
        L::load_b(p.add(128)),
        L::load_b(p.add(192)),
    ];
    [
        L::nib_lo(c[0]),
        L::nib_lo(c[1]),
        L::nib_lo(c[2]),
        L::nib_lo(c[3]),
        L::nib_hi(c[0]),
        L::nib_hi(c[1]),
        L::nib_hi(c[2]),
        L::nib_hi(c[3]),
    ]
}

/// `1.5 * 2^23`. An integer `s` with `|s| < 2^22` added to this float's bits gives the bits
/// of the float `1.5 * 2^23 + s` exactly (both have the exponent of `2^23`, whose unit in
/// the last place is 1).
const FLOAT_BIAS: f32 = 12_582_912.0;

/// The bits of [`FLOAT_BIAS`] less `offset`, as every lane's start of a dot product that
/// takes `offset` back out.
#[inline(always)]
unsafe fn biased<L: Lanes>(offset: i32) -> L::I {
    L::splat_i(FLOAT_BIAS.to_bits() as i32 - offset)
}

/// `start + sum_g w[g] . y[at + 4g..at + 4g + 4]`, per lane, for weight bytes below
/// `2^weight_bits`.
#[inline(always)]
unsafe fn dot_groups<L: Lanes>(
    start: L::I,
    w: &[L::B],
    row: &ActRow,
    at: usize,
    weight_bits: u32,
) -> L::I {
    L::dot4_run(start, w, row.q.add(at), weight_bits)
}

/// `sum` (a dot product started from [`biased`]) times `scale`, exactly, for `|sum * scale|
/// < 2^24`: `(1.5 * 2^23 + sum) * scale - 1.5 * 2^23 * scale` in one rounding, where
/// `unbias` is `-1.5 * 2^23 * scale` (exact for scales below 2^8).
#[inline(always)]
unsafe fn scaled<L: Lanes>(sum: L::I, scale: L::F, unbias: L::F) -> L::F {
    L::fma_f(L::bits_f(sum), scale, unbias)
}

/// `-1.5 * 2^23 * scale`, the term [`scaled`] adds to take the bias back out.
#[inline(always)]
unsafe fn unbias_for<L: Lanes>(scale: L::F) -> L::F {
    L::mul_f(scale, L::splat_f(-FLOAT_BIAS))
}

/// The sum in a dot product started from [`biased`], as a float (exact).
#[inline(always)]
unsafe fn unbiased<L: Lanes>(sum: L::I) -> L::F {
    L::sub_f(L::bits_f(sum), L::splat_f(FLOAT_BIAS))
}

#[inline(always)]
unsafe fn q4k<L: Lanes, const R: usize, const T: usize>(
    tiles: [*const u8; T],
    blocks: usize,
    rows: &[ActRow; R],
    prefetch: Prefetch,
) -> [[L::F; R]; T] {
    let mut acc = [[L::zero_f(); R]; T];
    for sb in 0..blocks {
        for (&tile, acc) in tiles.iter().zip(acc.iter_mut()) {
            let h = tile.add(sb * 2368);
            ahead::<L>(prefetch, h, 320);
            let d = L::load_f16(h);
            let dmin = L::load_f16(h.add(32));
            // The mins first, folded into the accumulators, so that their registers are free
            // for the codes.
            let mins: [L::I; 4] = std::array::from_fn(|q| L::load_u8_pairs(h.add(192 + 32 * q)));
            for r in 0..R {
                let mut msum = L::zero_i();
                for (q, m) in mins.iter().enumerate() {
                    msum = L::dot2(msum, *m, *rows[r].pairs32.add(sb * 4 + q));
                }
                let dy = *rows[r].d.add(sb);
                acc[r] = L::fma_f(L::mul_f(dmin, L::splat_f(-dy)), L::cvt(msum), acc[r]);
            }
            // Each 32-value sum (below 15 * 128 * 32) times its 6-bit scale, added in order.
            let mut sum = [L::zero_f(); R];
            for j in 0..8 {
                let codes = h.add(320 + 256 * j);
                ahead::<L>(prefetch, codes, 256);
                let sc = L::cvt(L::load_u8(h.add(64 + 16 * j)));
                let unbias = unbias_for::<L>(sc);
                let w = nibble_groups::<L>(codes);
                for r in 0..R {
                    let s = dot_groups::<L>(biased::<L>(0), &w, &rows[r], sb * 256 + 32 * j, 4);
                    sum[r] = L::add_f(sum[r], scaled::<L>(s, sc, unbias));
                }
            }
            for r in 0..R {
                let dy = *rows[r].d.add(sb);
                acc[r] = L::fma_f(L::mul_f(d, L::splat_f(dy)), sum[r], acc[r]);
            }
        }
    }
    acc
}

/// The fifth bit of group `g` (bit `g` of each byte) moved to bit 4.
#[inline(always)]
unsafe fn q5_high<L: Lanes>(qh: L::B, g: usize) -> L::B {
    match g {
        0 => L::shl_and::<4>(qh, 0x10),
        1 => L::shl_and::<3>(qh, 0x10),
        2 => L::shl_and::<2>(qh, 0x10),
        3 => L::shl_and::<1>(qh, 0x10),
        4 => L::and_b(qh, 0x10),
        5 => L::shr_and::<1>(qh, 0x10),
        6 => L::shr_and::<2>(qh, 0x10),
        _ => L::shr_and::<3>(qh, 0x10),
    }
}

/// Bits `2i..2i+2` of each byte moved to bits 4..6.
#[inline(always)]
unsafe fn q6_high<L: Lanes>(qh: L::B, i: usize) -> L::B {
    match i {
        0 => L::shl_and::<4>(qh, 0x30),
        1 => L::shl_and::<2>(qh, 0x30),
        2 => L::and_b(qh, 0x30),
        _ => L::shr_and::<2>(qh, 0x30),
    }
}

#[inline(always)]
unsafe fn q6k<L: Lanes, const R: usize, const T: usize>(
    tiles: [*const u8; T],
    blocks: usize,
    rows: &[ActRow; R],
    prefetch: Prefetch,
) -> [[L::F; R]; T] {
    let mut acc = [[L::zero_f(); R]; T];
    for sb in 0..blocks {
        for (&tile, acc) in tiles.iter().zip(acc.iter_mut()) {
            let h = tile.add(sb * 3360);
            ahead::<L>(prefetch, h, 288);
            let d = L::load_f16(h);
            // Each 16-value sum of (code - 32) * y (at most 32 * 128 * 16) times its 8-bit
            // scale, added in order.
            let mut sum = [L::zero_f(); R];
            for span in 0..8 {
                let p = h.add(288 + 384 * span);
                ahead::<L>(prefetch, p, 384);
                let scales = L::load_i8_pairs(h.add(32 + 32 * span));
                let sc = [L::cvt(L::low_i16(scales)), L::cvt(L::high_i16(scales))];
                let unbias = [unbias_for::<L>(sc[0]), unbias_for::<L>(sc[1])];
                let mut w = nibble_groups::<L>(p);
                let qh = [L::load_b(p.add(256)), L::load_b(p.add(320))];
                for (g, wg) in w.iter_mut().enumerate() {
                    *wg = L::or_b(*wg, q6_high::<L>(qh[g / 4], g % 4));
                }
                for r in 0..R {
                    for half in 0..2 {
                        let at = sb * 256 + 32 * span + 16 * half;
                        // The codes' zero point of 32, taken out from the start.
                        let start = biased::<L>(32 * *rows[r].sums16.add(at / 16));
                        let w = &w[4 * half..4 * half + 4];
                        let s = dot_groups::<L>(start, w, &rows[r], at, 6);
                        sum[r] = L::add_f(sum[r], scaled::<L>(s, sc[half], unbias[half]));
                    }
                }
            }
            for r in 0..R {
                let dy = *rows[r].d.add(sb);
                acc[r] = L::fma_f(L::mul_f(d, L::splat_f(dy)), sum[r], acc[r]);
            }
        }
    }
    acc
}

/// Q4_0 and Q5_0: unsigned codes with a zero point of 8 or 16.
#[inline(always)]
unsafe fn q_0<L: Lanes, const R: usize, const T: usize, const FIVE: bool>(
    tiles: [*const u8; T],
    blocks: usize,
    rows: &[ActRow; R],
    prefetch: Prefetch,
) -> [[L::F; R]; T] {
    let (bytes, zero) = if FIVE { (352, 16) } else { (288, 8) };
    let mut acc = [[L::zero_f(); R]; T];
    for b in 0..blocks {
        for (&tile, acc) in tiles.iter().zip(acc.iter_mut()) {
            let h = tile.add(b * bytes);
            ahead::<L>(prefetch, h, bytes);
            let d = L::load_f16(h);
            let mut w = nibble_groups::<L>(h.add(32));
            if FIVE {
                let qh = L::load_b(h.add(288));
                for (g, wg) in w.iter_mut().enumerate() {
                    *wg = L::or_b(*wg, q5_high::<L>(qh, g));
                }
            }
            for r in 0..R {
                let start = biased::<L>(zero * sum32(&rows[r], b));
                let bits = if FIVE { 5 } else { 4 };
                let s = dot_groups::<L>(start, &w, &rows[r], 32 * b, bits);
                let dy = *rows[r].d.add(b);
                acc[r] = L::fma_f(L::mul_f(d, L::splat_f(dy)), unbiased::<L>(s), acc[r]);
            }
        }
    }
    acc
}

#[inline(always)]
unsafe fn q8_0<L: Lanes, const R: usize, const T: usize>(
    tiles: [*const u8; T],
    blocks: usize,
    rows: &[ActRow; R],
    prefetch: Prefetch,
) -> [[L::F; R]; T] {
    let mut acc = [[L::zero_f(); R]; T];
    for b in 0..blocks {
        for (&tile, acc) in tiles.iter().zip(acc.iter_mut()) {
            let h = tile.add(b * 544);
            ahead::<L>(prefetch, h, 544);
            let d = L::load_f16(h);
            let w: [L::B; 8] = std::array::from_fn(|g| L::load_b(h.add(32 + 64 * g)));
            for r in 0..R {
                let mut s = biased::<L>(L::SIGNED_OFFSET * sum32(&rows[r], b));
                for (g, wg) in w.iter().enumerate() {
                    s = L::dot4_signed(s, *wg, y4(&rows[r], 32 * b + 4 * g));
                }
                let dy = *rows[r].d.add(b);
                acc[r] = L::fma_f(L::mul_f(d, L::splat_f(dy)), unbiased::<L>(s), acc[r]);
            }
        }
    }
    acc
}

/// Dense weights: one multiply-add per reduction index, in order.
#[inline(always)]
unsafe fn dense<L: Lanes, const R: usize, const T: usize>(
    tiles: [*const u8; T],
    len: usize,
    rows: &[ActRow; R],
    format: WeightFormat,
    prefetch: Prefetch,
) -> [[L::F; R]; T] {
    let width = format.block_bytes() * 16;
    let load = |tile: *const u8, k: usize| match format {
        WeightFormat::F32 => L::load_f32(tile.add(64 * k)),
        WeightFormat::F16 => L::load_f16(tile.add(32 * k)),
        _ => L::load_bf16(tile.add(32 * k)),
    };
    let mut acc = [[L::zero_f(); R]; T];
    // Four reduction indices per step, so the lines ahead are asked for once each.
    let whole = len / 4 * 4;
    for k in (0..whole).step_by(4) {
        for (&tile, acc) in tiles.iter().zip(acc.iter_mut()) {
            ahead::<L>(prefetch, tile.add(width * k), 4 * width);
            let w = [
                load(tile, k),
                load(tile, k + 1),
                load(tile, k + 2),
                load(tile, k + 3),
            ];
            for r in 0..R {
                let x = rows[r].x.add(k);
                for (i, wi) in w.iter().enumerate() {
                    acc[r] = L::fma_f(*wi, L::splat_f(*x.add(i)), acc[r]);
                }
            }
        }
    }
    for k in whole..len {
        for (&tile, acc) in tiles.iter().zip(acc.iter_mut()) {
            let w = load(tile, k);
            for r in 0..R {
                acc[r] = L::fma_f(w, L::splat_f(*rows[r].x.add(k)), acc[r]);
            }
        }
    }
    acc
}

#[inline(always)]
unsafe fn run<L: Lanes, const R: usize, const T: usize>(
    format: WeightFormat,
    tiles: [*const u8; T],
    blocks: usize,
    rows: &[ActRow; R],
    out: &mut [[[f32; 16]; MAX_ROWS]],
    prefetch: Prefetch,
) {
    let acc = match format {
        WeightFormat::Q4K => q4k::<L, R, T>(tiles, blocks, rows, prefetch),
        WeightFormat::Q6K => q6k::<L, R, T>(tiles, blocks, rows, prefetch),
        WeightFormat::Q4_0 => q_0::<L, R, T, false>(tiles, blocks, rows, prefetch),
        WeightFormat::Q5_0 => q_0::<L, R, T, true>(tiles, blocks, rows, prefetch),
        WeightFormat::Q8_0 => q8_0::<L, R, T>(tiles, blocks, rows, prefetch),
        dense_format => dense::<L, R, T>(tiles, blocks, rows, dense_format, prefetch),
    };
    for (acc, out) in acc.iter().zip(out) {
        for r in 0..R {
            L::store_f(out[r].as_mut_ptr(), acc[r]);
        }
    }
}

/// One pass over one tile, or two tiles of the same format and length at once, for
/// `rows.len()` (1..=8) rows, writing 16 outputs per row and tile into `out[tile][row]`.
///
/// Two tiles are read block by block in turn, so each worker keeps two streams of weight
/// lines in flight: with one, a worker leaves 10-15% of the read bandwidth unused while
/// its core computes.
#[inline(always)]
pub(crate) unsafe fn run_rows<L: Lanes>(
    format: WeightFormat,
    tiles: &[*const u8],
    blocks: usize,
    rows: &[ActRow],
    out: &mut [[[f32; 16]; MAX_ROWS]],
    prefetch: Prefetch,
) {
    match *tiles {
        [a, b] => by_rows::<L, 2>(format, [a, b], blocks, rows, out, prefetch),
        _ => by_rows::<L, 1>(format, [tiles[0]], blocks, rows, out, prefetch),
    }
}

#[inline(always)]
unsafe fn by_rows<L: Lanes, const T: usize>(
    format: WeightFormat,
    tiles: [*const u8; T],
    blocks: usize,
    rows: &[ActRow],
    out: &mut [[[f32; 16]; MAX_ROWS]],
    prefetch: Prefetch,
) {
    let row = |i: usize| rows[i];
    // The row count as a constant, so that each count gets its own unrolled kernel.
    macro_rules! with_rows {
        ($r:literal) => {
            run::<L, $r, T>(
                format,
                tiles,
                blocks,
                &std::array::from_fn(row),
                out,
                prefetch,
            )
        };
    }
    match rows.len() {
        1 => with_rows!(1),
        2 => with_rows!(2),
        3 => with_rows!(3),
        4 => with_rows!(4),
        5 => with_rows!(5),
        6 => with_rows!(6),
        7 => with_rows!(7),
        _ => with_rows!(8),
    }
}
