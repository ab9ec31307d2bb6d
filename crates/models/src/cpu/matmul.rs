//! Packed-weight matmuls over a set of input rows, several matrices per parallel region.
//!
//! Work is split only along output tiles: each tile (16 output columns, the whole reduction)
//! is computed by one thread for every input row, so neither the number of rows nor the
//! number of threads changes a single output bit.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::activation::{ActRow, QuantizedRows};
use super::format::ActivationKind;
use super::isa::Isa;
use super::pack::{PackedMatrix, TILE};
use super::pool::ThreadPool;
use super::streaming::Streaming;
use super::tile::{Prefetch, MAX_ROWS};

/// The input of a layer: f32 rows and, once asked for, their quantized forms.
#[derive(Default)]
pub struct LayerInput {
    rows: usize,
    cols: usize,
    x: Vec<f32>,
    q32: QuantizedRows,
    q256: QuantizedRows,
    /// Whether `q32` / `q256` hold the current rows.
    quantized: [bool; 2],
}

impl LayerInput {
    /// Makes room for `rows` rows of `cols` and returns the f32 rows to fill; earlier
    /// quantized forms are forgotten.
    pub fn reset(&mut self, rows: usize, cols: usize) -> &mut [f32] {
        self.rows = rows;
        self.cols = cols;
        self.x.resize(rows * cols, 0.0);
        self.quantized = [false; 2];
        &mut self.x[..rows * cols]
    }

    /// The f32 rows to change in place (`rows` rows of `cols`, as last reset); their
    /// quantized forms are forgotten.
    pub fn reset_keeping(&mut self, rows: usize, cols: usize) -> &mut [f32] {
        assert_eq!((rows, cols), (self.rows, self.cols), "rows kept in place");
        self.quantized = [false; 2];
        &mut self.x[..rows * cols]
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Quantizes the rows for every kind the given matrices need, rows split over the pool.
    pub fn prepare_for(&mut self, matrices: &[&PackedMatrix], pool: &ThreadPool) {
        let (rows, cols) = (self.rows, self.cols);
        for (slot, kind) in [ActivationKind::Q8Block32, ActivationKind::Q8Block256]
            .into_iter()
            .enumerate()
        {
            let needed = matrices.iter().any(|m| m.format().activation() == kind);
            if !needed || self.quantized[slot] {
                continue;
            }
            self.quantized[slot] = true;
            let target = match kind {
                ActivationKind::Q8Block32 => &mut self.q32,
                _ => &mut self.q256,
            };
            target.prepare(rows, cols, kind);
            let writer = target.writer();
            let x = &self.x;
            pool.for_each_index(rows, rows < 4, |r| {
                // SAFETY: each row is claimed by exactly one worker; the buffers outlive
                // the region.
                unsafe { writer.quantize(r, &x[r * cols..(r + 1) * cols]) };
            });
        }
    }

    fn act_row(&self, kind: ActivationKind, r: usize) -> ActRow {
        debug_assert!(
            kind == ActivationKind::Dense
                || self.quantized[(kind == ActivationKind::Q8Block256) as usize]
        );
        match kind {
            ActivationKind::Dense => ActRow::dense(self.x[r * self.cols..].as_ptr()),
            ActivationKind::Q8Block32 => self.q32.row(r),
            ActivationKind::Q8Block256 => self.q256.row(r),
        }
    }
}

/// Where a matrix's results go.
pub enum Output<'a> {
    /// `out[r * out_features + j] = y[r][j] + bias[j]`.
    Store {
        out: &'a mut [f32],
        bias: Option<&'a [f32]>,
    },
    /// The index and value of each row's largest output among the first `below` (the
    /// lowest index among equals), and with `runner_up` its second largest (`u32::MAX`
    /// when `below` is 1); only the tiles holding those outputs are read.
    Argmax {
        best: &'a mut [(u32, f32)],
        runner_up: Option<&'a mut [(u32, f32)]>,
        below: usize,
    },
    /// The task's matrix is a gate projection and `up` the up projection of the same
    /// shape: `out[r * out_features + j] = silu(gate[r][j]) * up[r][j]`, each tile of both
    /// computed by one worker, so neither projection is ever stored.
    SwiGlu {
        up: &'a PackedMatrix,
        out: &'a mut [f32],
    },
}

/// One matrix of a parallel region.
pub struct Task<'a> {
    pub matrix: &'a PackedMatrix,
    pub input: &'a LayerInput,
    pub output: Output<'a>,
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: workers write disjoint column ranges (one tile each).
unsafe impl Sync for SendPtr {}
// SAFETY: as for Sync: the pointer outlives the scoped workers it is sent to.
unsafe impl Send for SendPtr {}

/// Per-worker argmax candidates (each row's best two), one slot per worker.
struct ArgmaxSlots(Vec<UnsafeCell<Vec<TopTwo>>>);

type TopTwo = [(u32, f32); 2];

/// Offers `candidate` to a row's best two.
fn offer(top: &mut TopTwo, candidate: (u32, f32)) {
    if better(candidate, top[0]) {
        top[1] = top[0];
        top[0] = candidate;
    } else if better(candidate, top[1]) {
        top[1] = candidate;
    }
}
// SAFETY: worker `w` only touches slot `w`.
unsafe impl Sync for ArgmaxSlots {}

fn better(candidate: (u32, f32), best: (u32, f32)) -> bool {
    candidate.1 > best.1 || (candidate.1 == best.1 && candidate.0 < best.0) || best.1.is_nan()
}

const NONE: (u32, f32) = (u32::MAX, f32::NAN);

/// Most matrices one parallel region runs.
pub const MAX_TASKS: usize = 4;

/// What the workers read of one task.
struct Part<'a> {
    matrix: &'a PackedMatrix,
    input: &'a LayerInput,
    bias: Option<&'a [f32]>,
    out: Option<SendPtr>,
    /// The task's first tile in the region's numbering.
    start: usize,
    /// Tiles of the matrix the task reads (all but for a restricted argmax).
    tiles: usize,
    /// Outputs past this index are not computed.
    columns: usize,
    argmax: Option<ArgmaxSlots>,
    /// The up projection of a SwiGLU task.
    up: Option<&'a PackedMatrix>,
    /// Whether each worker reads one stream of weight lines rather than two (see `run`).
    one_stream: bool,
    prefetch: Prefetch,
}

/// Runs every task (at most [`MAX_TASKS`]) in one parallel region; apart from argmax
/// candidates nothing is allocated.
pub fn run(tasks: &mut [Task<'_>], pool: &ThreadPool, isa: Isa) {
    assert!(isa.supported(), "kernel set {} not supported", isa.name());
    assert!(
        tasks.len() <= MAX_TASKS,
        "{} matmuls in one region",
        tasks.len()
    );
    for t in tasks.iter() {
        assert_eq!(t.matrix.in_features(), t.input.cols(), "matmul input width");
        match &t.output {
            Output::Store { out, bias } => {
                assert!(out.len() >= t.input.rows() * t.matrix.out_features());
                assert!(bias.is_none_or(|b| b.len() == t.matrix.out_features()));
            }
            Output::Argmax {
                best,
                runner_up,
                below,
            } => {
                assert_eq!(best.len(), t.input.rows());
                assert!(runner_up.as_ref().is_none_or(|r| r.len() == t.input.rows()));
                assert!((1..=t.matrix.out_features()).contains(below));
            }
            Output::SwiGlu { up, out } => {
                // Both read the same quantized rows.
                assert_eq!(up.format().activation(), t.matrix.format().activation());
                assert_eq!(
                    (up.out_features(), up.in_features()),
                    (t.matrix.out_features(), t.matrix.in_features())
                );
                assert!(out.len() >= t.input.rows() * t.matrix.out_features());
            }
        }
    }
    let threads = pool.threads();
    // Regions of up to MAX_ROWS rows read each weight line once; their hint is measured
    // (see `Streaming`). More rows read a tile again per group of rows.
    let single_pass = tasks.iter().all(|t| t.input.rows() <= MAX_ROWS);
    let (prefetch, ticket) = if single_pass {
        Streaming::global().next()
    } else {
        (Prefetch::Reuse, None)
    };
    let mut streamed = 0;
    let mut total = 0;
    let mut parts: [Option<Part<'_>>; MAX_TASKS] = std::array::from_fn(|_| None);
    for (part, t) in parts.iter_mut().zip(tasks.iter_mut()) {
        let columns = match &t.output {
            Output::Argmax { below, .. } => *below,
            _ => t.matrix.out_features(),
        };
        let (out, bias, argmax, up) = match &mut t.output {
            Output::Store { out, bias } => (Some(SendPtr(out.as_mut_ptr())), *bias, None, None),
            Output::Argmax { .. } => (
                None,
                None,
                Some(ArgmaxSlots(
                    (0..threads)
                        .map(|_| UnsafeCell::new(vec![[NONE; 2]; t.input.rows()]))
                        .collect(),
                )),
                None,
            ),
            Output::SwiGlu { up, out } => (Some(SendPtr(out.as_mut_ptr())), None, None, Some(*up)),
        };
        *part = Some(Part {
            matrix: t.matrix,
            input: t.input,
            bias,
            out,
            start: total,
            tiles: columns.div_ceil(TILE),
            columns,
            argmax,
            up,
            one_stream: threads > 1 && t.input.rows() <= MAX_ROWS,
            prefetch,
        });
        let tiles = columns.div_ceil(TILE);
        streamed += tiles * (t.matrix.tile_bytes() + up.map_or(0, PackedMatrix::tile_bytes));
        total += tiles;
    }
    if total == 0 {
        return;
    }
    let parts = &parts[..tasks.len()];
    let next = AtomicUsize::new(0);
    let elapsed = pool.run(&|worker| loop {
        // Guided: runs of up to 64 tiles (long streams of weight lines), then each
        // worker's share of what is left, so that the workers finish together. On a 2-core
        // Zen 5 this made a 0.5B decode step 2-5% faster than a fixed 1/16 of the tiles.
        let mut first = next.load(Ordering::Relaxed);
        let end = loop {
            if first >= total {
                break None;
            }
            let end = (first + ((total - first) / threads).clamp(1, 64)).min(total);
            match next.compare_exchange_weak(first, end, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break Some(end),
                Err(now) => first = now,
            }
        };
        let Some(end) = end else { break };
        for part in parts.iter().flatten() {
            let tiles = part.start..part.start + part.tiles;
            let (from, to) = (first.max(tiles.start), end.min(tiles.end));
            if from >= to {
                continue;
            }
            let (from, to) = (from - part.start, to - part.start);
            let mut argmax = part.argmax.as_ref().map(|slots| {
                // SAFETY: slot `worker` belongs to this worker alone.
                unsafe { &mut *slots.0[worker].get() }
            });
            // A lone worker keeps two streams of weight lines in flight, reading tile i of
            // the first half beside tile i of the second (far enough apart to be fetched
            // independently): on one core a single stream left 10-15% of the read
            // bandwidth unused on a Xeon, and 2-9% for most formats on a Zen 5. With two
            // or more workers a single stream each was 2-13% faster per format (2-core
            // Zen 5): more streams contend for the memory. A SwiGLU tile reads gate and
            // up (see `run_tiles`).
            if part.up.is_none() && !part.one_stream {
                let half = (to - from) / 2;
                for i in from..from + half {
                    run_tiles(part, &[i, i + half], isa, argmax.as_deref_mut());
                }
                if (to - from) % 2 == 1 {
                    run_tiles(part, &[to - 1], isa, argmax.as_deref_mut());
                }
            } else {
                for g in from..to {
                    run_tiles(part, &[g], isa, argmax.as_deref_mut());
                }
            }
        }
    });
    if let Some(ticket) = ticket {
        Streaming::global().report(ticket, elapsed, streamed);
    }
    for (t, part) in tasks.iter_mut().zip(parts) {
        if let (
            Output::Argmax {
                best, runner_up, ..
            },
            Some(Part {
                argmax: Some(slots),
                ..
            }),
        ) = (&mut t.output, part)
        {
            // The best two overall are among the workers' best two.
            let mut merged = vec![[NONE; 2]; best.len()];
            for cell in &slots.0 {
                // SAFETY: the region is over; no worker holds a slot.
                let candidates = unsafe { &*cell.get() };
                for (top, pair) in merged.iter_mut().zip(candidates) {
                    for c in pair {
                        if c.0 != u32::MAX {
                            offer(top, *c);
                        }
                    }
                }
            }
            for (b, top) in best.iter_mut().zip(&merged) {
                *b = top[0];
            }
            if let Some(runner_up) = runner_up {
                for (r, top) in runner_up.iter_mut().zip(&merged) {
                    *r = top[1];
                }
            }
        }
    }
}

/// One tile, or two read together (see [`Isa::run_tiles`]), for every input row.
fn run_tiles(part: &Part<'_>, tiles: &[usize], isa: Isa, mut argmax: Option<&mut Vec<TopTwo>>) {
    let (matrix, input, out, bias) = (part.matrix, part.input, part.out, part.bias);
    let kind = matrix.format().activation();
    let n_out = matrix.out_features();
    let ptrs = [
        matrix.tile_ptr(tiles[0]),
        matrix.tile_ptr(tiles[tiles.len() - 1]),
    ];
    let mut buf = [[[0f32; 16]; MAX_ROWS]; 2];
    let prefetch = part.prefetch;
    let mut r0 = 0;
    while r0 < input.rows() {
        let n = MAX_ROWS.min(input.rows() - r0);
        let mut rows = [ActRow::dense(std::ptr::null()); MAX_ROWS];
        for (i, row) in rows.iter_mut().take(n).enumerate() {
            *row = input.act_row(kind, r0 + i);
        }
        match part.up {
            // SAFETY: `isa` is supported (checked in `run`), the tiles and rows match the
            // matrices (the up projection has the gate's shape and activation kind).
            Some(up) => unsafe {
                for (&tile, buf) in tiles.iter().zip(buf.iter_mut()) {
                    isa.run_swiglu_tile(
                        [
                            (matrix.format(), matrix.tile_ptr(tile), matrix.blocks()),
                            (up.format(), up.tile_ptr(tile), up.blocks()),
                        ],
                        &rows[..n],
                        buf,
                        prefetch,
                        // Gate and up one after the other where that is one stream.
                        !(part.one_stream && matrix.tiles_precede(up)),
                    )
                }
            },
            // SAFETY: as above; paired tiles are tiles of one matrix.
            None => unsafe {
                isa.run_tiles(
                    matrix.format(),
                    &ptrs[..tiles.len()],
                    matrix.blocks(),
                    &rows[..n],
                    &mut buf,
                    prefetch,
                )
            },
        }
        for (&tile, buf) in tiles.iter().zip(&buf) {
            let first_col = tile * TILE;
            let valid = TILE.min(part.columns - first_col);
            for (i, vals) in buf.iter().take(n).enumerate() {
                let r = r0 + i;
                if let Some(SendPtr(out)) = out {
                    // SAFETY: this tile alone writes columns first_col..first_col + valid
                    // of row r.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(out.add(r * n_out + first_col), valid)
                    };
                    match bias {
                        Some(b) => {
                            for ((d, v), b) in dst.iter_mut().zip(vals).zip(&b[first_col..]) {
                                *d = v + b;
                            }
                        }
                        None => dst.copy_from_slice(&vals[..valid]),
                    }
                }
                if let Some(best) = argmax.as_deref_mut() {
                    // Most tiles hold nothing above the row's runner-up: one vector maximum
                    // settles them (a tile whose best only equals it still goes through
                    // `offer`, which breaks ties by index).
                    let top = vals[..valid]
                        .iter()
                        .fold(f32::NEG_INFINITY, |m, v| m.max(*v));
                    let runner_up = best[r][1].1;
                    if top < runner_up {
                        continue;
                    }
                    for (c, v) in vals.iter().take(valid).enumerate() {
                        if !v.is_nan() {
                            offer(&mut best[r], ((first_col + c) as u32, *v));
                        }
                    }
                }
            }
        }
        r0 += n;
    }
}
