//! The kernels against a float reference, and their row, thread and instruction-set
//! invariance, for every format.

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};

use super::*;
use crate::test_rng::Lcg;

/// GGUF bytes of a random `[out, inp]` weight in `format`, and its dequantized values.
fn weight(format: WeightFormat, out: usize, inp: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut rng = Lcg(seed);
    let values: Vec<f32> = (0..out * inp).map(|_| rng.next() * 0.5).collect();
    let t = Tensor::from_vec(values, (out, inp), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, format.ggml()).unwrap();
    let raw = q.data().unwrap().to_vec();
    let mut deq = vec![0f32; out * inp];
    let row = format.row_bytes(inp).unwrap();
    for r in 0..out {
        dequantize_row(
            format,
            &raw[r * row..(r + 1) * row],
            &mut deq[r * inp..(r + 1) * inp],
        );
    }
    (raw, deq)
}

fn inputs(rows: usize, inp: usize, seed: u64) -> Vec<f32> {
    let mut rng = Lcg(seed);
    (0..rows * inp).map(|_| rng.next()).collect()
}

/// The first `rows` rows of `x`, prepared for `matrices` (all of one input width).
fn layer_input(
    matrices: &[&PackedMatrix],
    x: &[f32],
    rows: usize,
    pool: &ThreadPool,
) -> LayerInput {
    let inp = matrices[0].in_features();
    let mut input = LayerInput::default();
    input.reset(rows, inp).copy_from_slice(&x[..rows * inp]);
    input.prepare_for(matrices, pool);
    input
}

fn multiply(m: &PackedMatrix, x: &[f32], rows: usize, pool: &ThreadPool, isa: Isa) -> Vec<f32> {
    let input = layer_input(&[m], x, rows, pool);
    let mut out = vec![0f32; rows * m.out_features()];
    matmul(
        &mut [Task {
            matrix: m,
            input: &input,
            output: Output::Store {
                out: &mut out,
                bias: None,
            },
        }],
        pool,
        isa,
    );
    out
}

const SHAPES: [(WeightFormat, usize, usize); 8] = [
    (WeightFormat::Q4K, 40, 512),
    (WeightFormat::Q6K, 33, 512),
    (WeightFormat::Q4_0, 35, 96),
    (WeightFormat::Q5_0, 48, 128),
    (WeightFormat::Q8_0, 17, 64),
    // Dense reduction lengths that are not whole steps of the kernel's four indices too.
    (WeightFormat::F32, 20, 50),
    (WeightFormat::F16, 18, 41),
    (WeightFormat::BF16, 16, 24),
];

#[test]
fn gguf_rows_decode_like_candle() {
    for (format, out, inp) in SHAPES {
        let (raw, ours) = weight(format, out, inp, 3);
        let q = QTensor::new(
            candle_core::quantized::QStorage::from_data(
                std::borrow::Cow::Owned(raw),
                &Device::Cpu,
                format.ggml(),
            )
            .unwrap(),
            (out, inp),
        )
        .unwrap();
        let theirs: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "{format:?} value {i}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn packed_matmul_matches_the_float_reference() {
    let pool = ThreadPool::new(2);
    for (format, out, inp) in SHAPES {
        let (raw, deq) = weight(format, out, inp, 5);
        let m = PackedMatrix::from_gguf(format, out, inp, &raw, &pool).unwrap();
        let rows = 3;
        let x = inputs(rows, inp, 9);
        let y = multiply(&m, &x, rows, &pool, Isa::active());
        for r in 0..rows {
            for j in 0..out {
                let exact: f64 = (0..inp)
                    .map(|k| deq[j * inp + k] as f64 * x[r * inp + k] as f64)
                    .sum();
                let norm: f64 = (0..inp)
                    .map(|k| (deq[j * inp + k] as f64 * x[r * inp + k] as f64).abs())
                    .sum();
                // Activations are quantized to 8 bits for the integer formats.
                let tol = match format.activation() {
                    ActivationKind::Dense => 1e-5 * norm.max(1.0),
                    _ => 1.5e-2 * norm.max(1e-3),
                };
                let got = y[r * out + j] as f64;
                assert!(
                    (got - exact).abs() <= tol,
                    "{format:?} row {r} col {j}: {got} vs {exact} (tol {tol})"
                );
            }
        }
    }
}

/// Activations of equal magnitude quantize to +-127 exactly, so the integer formats owe
/// the float reference all but rounding; signs matched to a column's weights drive its
/// integer sums to their largest, where a sum leaving the range the kernels rely on (see
/// `tile::FLOAT_BIAS`) would show.
#[test]
fn full_scale_activations_give_the_float_reference_to_rounding() {
    let pool = ThreadPool::new(2);
    for (format, out, inp) in SHAPES {
        if format.activation() == ActivationKind::Dense {
            continue;
        }
        let (raw, deq) = weight(format, out, inp, 11);
        let m = PackedMatrix::from_gguf(format, out, inp, &raw, &pool).unwrap();
        let sign = |v: f32| if v < 0.0 { -1.0 } else { 1.0 };
        let x: Vec<f32> = (0..inp)
            .map(|k| sign(deq[k]))
            .chain((0..inp).map(|k| -sign(deq[(out - 1) * inp + k])))
            .chain((0..inp).map(|_| 1.0))
            .collect();
        let y = multiply(&m, &x, 3, &pool, Isa::active());
        for r in 0..3 {
            for j in 0..out {
                let products = (0..inp).map(|k| deq[j * inp + k] as f64 * x[r * inp + k] as f64);
                let exact: f64 = products.clone().sum();
                let norm: f64 = products.map(f64::abs).sum();
                let got = y[r * out + j] as f64;
                assert!(
                    (got - exact).abs() <= 1e-5 * norm,
                    "{format:?} row {r} col {j}: {got} vs {exact}"
                );
            }
        }
    }
}

/// GGUF bytes of an `[out, inp]` weight whose every code is the largest its format has (the
/// scales 1.0 in f16, the K-quants' 6-bit scales and mins at their largest too).
fn largest_codes(format: WeightFormat, out: usize, inp: usize) -> Vec<u8> {
    const ONE: [u8; 2] = [0x00, 0x3c];
    let block: Vec<u8> = match format {
        WeightFormat::Q4_0 => [&ONE[..], &[0xff; 16]].concat(),
        WeightFormat::Q5_0 => [&ONE[..], &[0xff; 20]].concat(),
        WeightFormat::Q8_0 => [&ONE[..], &[0x7f; 32]].concat(),
        WeightFormat::Q4K => [&ONE[..], &ONE, &[0xff; 140]].concat(),
        WeightFormat::Q6K => [&[0xff; 192][..], &[0x7f; 16], &ONE].concat(),
        other => panic!("{other:?} has no codes"),
    };
    let row = format.row_bytes(inp).unwrap();
    assert_eq!(row % block.len(), 0, "{format:?}");
    block.repeat(out * row / block.len())
}

/// With every code at its largest and every activation at +-127, each 16-bit pair sum a
/// kernel set may add before widening is at its largest: a set that adds more of them than
/// 16 bits hold gives other bits than the portable one's 32-bit sums.
#[test]
fn the_largest_codes_at_full_scale_give_every_kernel_set_the_same_bits() {
    let pool = ThreadPool::new(2);
    let formats = [
        WeightFormat::Q4K,
        WeightFormat::Q6K,
        WeightFormat::Q4_0,
        WeightFormat::Q5_0,
        WeightFormat::Q8_0,
    ];
    for format in formats {
        let (out, inp) = (32, 512);
        let raw = largest_codes(format, out, inp);
        let m = PackedMatrix::from_gguf(format, out, inp, &raw, &pool).unwrap();
        let rows = 8;
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| if (i / inp) % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        let reference = multiply(&m, &x, rows, &pool, Isa::Portable);
        assert!(
            reference.iter().all(|v| v.is_finite() && *v != 0.0),
            "{format:?}"
        );
        for isa in Isa::available() {
            for n in 1..=rows {
                let y = multiply(&m, &x, n, &pool, isa);
                assert!(
                    y.iter()
                        .zip(&reference)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{format:?} {} {n} rows: other bits than portable's",
                    isa.name()
                );
            }
        }
    }
}

/// Matrices wide enough that workers take chunks of several tiles and read them in
/// pairs, with a tile that one thread count reads paired and another alone.
const WIDE_SHAPES: [(WeightFormat, usize, usize); 5] = [
    (WeightFormat::Q4K, 1000, 256),
    (WeightFormat::Q6K, 1000, 256),
    (WeightFormat::Q5_0, 1000, 64),
    (WeightFormat::Q8_0, 1000, 64),
    (WeightFormat::F16, 1000, 24),
];

#[test]
fn every_row_count_thread_count_and_kernel_set_gives_the_same_bits() {
    let pools: Vec<ThreadPool> = (1..=3).map(ThreadPool::new).collect();
    for (format, out, inp) in SHAPES.into_iter().chain(WIDE_SHAPES) {
        let (raw, _) = weight(format, out, inp, 7);
        let m = PackedMatrix::from_gguf(format, out, inp, &raw, &pools[1]).unwrap();
        let x = inputs(16, inp, 11);
        let reference = multiply(&m, &x, 1, &pools[0], Isa::Portable);
        for isa in Isa::available() {
            for pool in &pools {
                for n in 1..=16 {
                    let y = multiply(&m, &x, n, pool, isa);
                    // Row 0 equals row 0 alone; every row equals itself alone.
                    assert!(
                        y[..out]
                            .iter()
                            .zip(&reference)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{format:?} {} threads {} rows {n}: row 0 differs",
                        isa.name(),
                        pool.threads()
                    );
                    if n == 16 {
                        for r in 1..n {
                            let alone = multiply(&m, &x[r * inp..], 1, &pools[0], Isa::Portable);
                            assert!(
                                y[r * out..(r + 1) * out]
                                    .iter()
                                    .zip(&alone)
                                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{format:?} {} row {r} of 16 differs from alone",
                                isa.name()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn argmax_epilogue_picks_the_largest_stored_output() {
    let pool = ThreadPool::new(3);
    let (format, out, inp) = (WeightFormat::Q6K, 300, 256);
    let (raw, _) = weight(format, out, inp, 13);
    let m = PackedMatrix::from_gguf(format, out, inp, &raw, &pool).unwrap();
    let rows = 5;
    let x = inputs(rows, inp, 17);
    let y = multiply(&m, &x, rows, &pool, Isa::active());
    let input = layer_input(&[&m], &x, rows, &pool);
    let mut best = vec![(0u32, 0f32); rows];
    matmul(
        &mut [Task {
            matrix: &m,
            input: &input,
            output: Output::Argmax {
                best: &mut best,
                runner_up: None,
                below: out,
            },
        }],
        &pool,
        Isa::active(),
    );
    let mut below = vec![(0u32, 0f32); rows];
    let mut second = vec![(0u32, 0f32); rows];
    let limit = 137;
    matmul(
        &mut [Task {
            matrix: &m,
            input: &input,
            output: Output::Argmax {
                best: &mut below,
                runner_up: Some(&mut second),
                below: limit,
            },
        }],
        &pool,
        Isa::active(),
    );
    for r in 0..rows {
        let row = &y[r * out..r * out + limit];
        let (idx, val) =
            row.iter().enumerate().fold(
                (0, f32::NEG_INFINITY),
                |b, (i, v)| if *v > b.1 { (i, *v) } else { b },
            );
        assert_eq!(
            below[r],
            (idx as u32, val),
            "row {r}, outputs below {limit}"
        );
        let runner_up = row.iter().enumerate().filter(|&(i, _)| i != idx).fold(
            (0, f32::NEG_INFINITY),
            |b, (i, v)| {
                if *v > b.1 {
                    (i, *v)
                } else {
                    b
                }
            },
        );
        assert_eq!(
            second[r],
            (runner_up.0 as u32, runner_up.1),
            "row {r}, runner-up below {limit}"
        );
    }
    for r in 0..rows {
        let row = &y[r * out..(r + 1) * out];
        let (idx, val) =
            row.iter().enumerate().fold(
                (0, f32::NEG_INFINITY),
                |b, (i, v)| if *v > b.1 { (i, *v) } else { b },
            );
        assert_eq!(best[r], (idx as u32, val));
    }
}

#[test]
fn packing_keeps_the_gguf_size_but_for_q4k_scales() {
    let pool = ThreadPool::new(1);
    for (format, out, inp) in SHAPES {
        let (raw, _) = weight(format, out, inp, 1);
        let m = PackedMatrix::from_gguf(format, out, inp, &raw, &pool).unwrap();
        let padded = out.div_ceil(TILE) * TILE * format.row_bytes(inp).unwrap();
        let expected = match format {
            WeightFormat::Q4K => padded * 148 / 144,
            _ => padded,
        };
        assert_eq!(m.bytes(), expected, "{format:?}");
    }
}

#[test]
fn interleaved_matrices_equal_separately_packed_ones() {
    let pool = ThreadPool::new(2);
    for (format, out, inp) in SHAPES.into_iter().chain(WIDE_SHAPES) {
        let raws: Vec<Vec<u8>> = (0..3).map(|s| weight(format, out, inp, 31 + s).0).collect();
        let together = PackedMatrix::interleaved_from_gguf(
            format,
            out,
            inp,
            [&raws[0][..], &raws[1][..], &raws[2][..]],
            &pool,
        )
        .unwrap();
        assert!(together[0].tiles_precede(&together[1]) && together[1].tiles_precede(&together[2]));
        assert!(!together[1].tiles_precede(&together[0]));
        let x = inputs(9, inp, 37);
        for (m, raw) in together.iter().zip(&raws) {
            let alone = PackedMatrix::from_gguf(format, out, inp, raw, &pool).unwrap();
            assert!(!alone.tiles_precede(m) && !m.tiles_precede(&alone));
            assert_eq!(m.bytes(), alone.bytes(), "{format:?}");
            for rows in [1, 9] {
                let (a, b) = (
                    multiply(m, &x, rows, &pool, Isa::active()),
                    multiply(&alone, &x, rows, &pool, Isa::active()),
                );
                assert!(
                    a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{format:?} {rows} rows"
                );
            }
        }
    }
}

/// `silu(gate) * up` computed through [`Output::SwiGlu`].
fn swiglu(
    gate: &PackedMatrix,
    up: &PackedMatrix,
    x: &[f32],
    rows: usize,
    pool: &ThreadPool,
    isa: Isa,
) -> Vec<f32> {
    let input = layer_input(&[gate, up], x, rows, pool);
    let mut fused = vec![0f32; rows * gate.out_features()];
    matmul(
        &mut [Task {
            matrix: gate,
            input: &input,
            output: Output::SwiGlu {
                up,
                out: &mut fused,
            },
        }],
        pool,
        isa,
    );
    fused
}

#[test]
fn swiglu_output_equals_silu_of_gate_times_up() {
    let pools: Vec<ThreadPool> = (1..=3).map(ThreadPool::new).collect();
    // Separately packed gate and up are read side by side; interleaved ones one after the
    // other where workers read one stream each.
    for (format, out, inp) in [(WeightFormat::Q4K, 40, 256), (WeightFormat::Q6K, 1000, 256)] {
        let (gate_raw, _) = weight(format, out, inp, 21);
        let (up_raw, _) = weight(format, out, inp, 22);
        let gate = PackedMatrix::from_gguf(format, out, inp, &gate_raw, &pools[1]).unwrap();
        let up = PackedMatrix::from_gguf(format, out, inp, &up_raw, &pools[1]).unwrap();
        let [gate_i, up_i] = PackedMatrix::interleaved_from_gguf(
            format,
            out,
            inp,
            [&gate_raw[..], &up_raw[..]],
            &pools[1],
        )
        .unwrap();
        let x = inputs(11, inp, 23);
        let g = multiply(&gate, &x, 11, &pools[0], Isa::Portable);
        let u = multiply(&up, &x, 11, &pools[0], Isa::Portable);
        for isa in Isa::available() {
            for pool in &pools {
                for rows in [1, 4, 11] {
                    for (gm, um) in [(&gate, &up), (&gate_i, &up_i)] {
                        let fused = swiglu(gm, um, &x, rows, pool, isa);
                        for (i, f) in fused.iter().enumerate() {
                            let want = g[i] / (1.0 + ops::exp(-g[i])) * u[i];
                            assert_eq!(
                                f.to_bits(),
                                want.to_bits(),
                                "{format:?} {} {} threads {rows} rows, element {i}",
                                isa.name(),
                                pool.threads()
                            );
                        }
                    }
                }
            }
        }
    }
}
