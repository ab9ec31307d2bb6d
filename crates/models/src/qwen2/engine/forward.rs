//! One packed forward pass of the engine.

use crate::cpu::ops::{add, rms_norm, rope};
use crate::cpu::{
    attend, attend_trees, dequantize_row, with_isa, Heads, Isa, LayerInput, Output, Span, Task,
    ThreadPool,
};

use super::weights::LayerWeights;
use super::{Engine, EngineRow};

/// Buffers reused by every forward (they only grow).
#[derive(Default)]
pub(crate) struct Workspace {
    spans: Vec<Span>,
    tokens: Vec<u32>,
    x: Vec<f32>,
    input: LayerInput,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: LayerInput,
    proj: Vec<f32>,
    /// The up projection, when it cannot be fused with the gate (see `Engine::layer`).
    up: Vec<f32>,
    mlp: LayerInput,
    cos: Vec<f32>,
    sin: Vec<f32>,
    pub(super) head: LayerInput,
}

/// Element work below which a per-row loop stays on the calling thread.
const PARALLEL_ELEMENTS: usize = 1 << 16;

/// Runs `f(r, row)` for every row of `buf` (rows of `width`), in parallel when large.
fn for_rows(
    buf: &mut [f32],
    width: usize,
    pool: &ThreadPool,
    isa: Isa,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    let inline = buf.len() < PARALLEL_ELEMENTS;
    pool.for_each_chunk_mut(buf, width, inline, |r, row| with_isa(isa, || f(r, row)));
}

/// `out` row `r` = RMS-normed row `r` of `x` (rows of `weight.len()`), times `weight`.
fn norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32], pool: &ThreadPool, isa: Isa) {
    let h = weight.len();
    for_rows(out, h, pool, isa, |r, row| {
        rms_norm(&x[r * h..(r + 1) * h], weight, eps, row)
    });
}

impl Engine {
    pub(super) fn forward_into(&self, rows: &mut [EngineRow<'_>], ws: &mut Workspace) -> Vec<f32> {
        let c = &self.config;
        let h = c.hidden_size;
        // Taken out of the workspace for the pass (its storage is kept, not reallocated) so
        // the layers can borrow it beside the workspace's buffers.
        let mut spans = std::mem::take(&mut ws.spans);
        Span::pack_into(
            rows.iter().map(|row| (row.tokens.len(), row.past)),
            &mut spans,
        );
        ws.tokens.clear();
        ws.tokens.extend(rows.iter().flat_map(|row| row.tokens));
        let (tokens, n) = (&ws.tokens, ws.tokens.len());
        let (pool, isa) = (self.pool, self.isa);

        let table = &self.weights.embedding;
        ws.x.resize(n * h, 0.0);
        for_rows(&mut ws.x[..n * h], h, pool, isa, |r, x| {
            let at = tokens[r] as usize * table.row_bytes;
            dequantize_row(table.format, &table.data[at..at + table.row_bytes], x);
        });

        // A tree's node sits at the position its depth gives (its slot in the cache is
        // still `past + i`).
        let positions = spans
            .iter()
            .zip(rows.iter())
            .flat_map(|(span, row)| crate::tree::positions(row.parents, span.len, span.past));
        self.rope.fill(positions, &mut ws.cos, &mut ws.sin);

        for (index, layer) in self.weights.layers.iter().enumerate() {
            self.layer(index, layer, &spans, rows, ws, n);
        }
        ws.spans = spans;

        let mut hidden = vec![0f32; n * h];
        let eps = c.rms_norm_eps as f32;
        norm_rows(
            &ws.x,
            &self.weights.output_norm,
            eps,
            &mut hidden,
            pool,
            isa,
        );
        hidden
    }

    fn layer(
        &self,
        index: usize,
        l: &LayerWeights,
        spans: &[Span],
        rows: &mut [EngineRow<'_>],
        ws: &mut Workspace,
        n: usize,
    ) {
        let c = &self.config;
        let (h, kv, ffn, hd) = (c.hidden_size, c.kv_dim(), c.intermediate_size, c.head_dim);
        let eps = c.rms_norm_eps as f32;
        let (pool, isa) = (self.pool, self.isa);

        // Attention: the normed input is quantized once for q, k and v.
        norm_rows(&ws.x, &l.attn_norm, eps, ws.input.reset(n, h), pool, isa);
        ws.input.prepare_for(&[&l.q, &l.k, &l.v], pool);
        ws.q.resize(n * h, 0.0);
        ws.k.resize(n * kv, 0.0);
        ws.v.resize(n * kv, 0.0);
        crate::cpu::matmul(
            &mut [
                store(&l.q, &ws.input, &mut ws.q[..n * h], &l.q_bias),
                store(&l.k, &ws.input, &mut ws.k[..n * kv], &l.k_bias),
                store(&l.v, &ws.input, &mut ws.v[..n * kv], &l.v_bias),
            ],
            pool,
            isa,
        );
        let half = hd / 2;
        let (cos, sin) = (&ws.cos, &ws.sin);
        with_isa(isa, || {
            for r in 0..n {
                let (cs, sn) = (
                    &cos[r * half..(r + 1) * half],
                    &sin[r * half..(r + 1) * half],
                );
                rope(&mut ws.q[r * h..(r + 1) * h], hd, cs, sn);
                rope(&mut ws.k[r * kv..(r + 1) * kv], hd, cs, sn);
            }
        });
        for (span, row) in spans.iter().zip(rows.iter_mut()) {
            for i in 0..span.len {
                let t = span.start + i;
                row.kv.write(
                    index,
                    span.past + i,
                    &ws.k[t * kv..(t + 1) * kv],
                    &ws.v[t * kv..(t + 1) * kv],
                );
            }
        }
        let heads = Heads {
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let out = ws.attn.reset(n, h);
        if rows.iter().all(|row| row.parents.is_empty()) {
            attend(&ws.q[..n * h], spans, rows, index, heads, out, pool, isa);
        } else {
            let trees: Vec<&[u32]> = rows.iter().map(|row| row.parents).collect();
            let q = &ws.q[..n * h];
            attend_trees(q, spans, &trees, rows, index, heads, out, pool, isa);
        }
        project_residual(&l.o, &mut ws.attn, &mut ws.proj, &mut ws.x, n, pool, isa);

        // MLP: the normed input is quantized once for gate and up.
        norm_rows(&ws.x, &l.ffn_norm, eps, ws.input.reset(n, h), pool, isa);
        ws.input.prepare_for(&[&l.gate, &l.up], pool);
        if l.gate.format().activation() == l.up.format().activation() {
            crate::cpu::matmul(
                &mut [Task {
                    matrix: &l.gate,
                    input: &ws.input,
                    output: Output::SwiGlu {
                        up: &l.up,
                        out: ws.mlp.reset(n, ffn),
                    },
                }],
                pool,
                isa,
            );
        } else {
            // Gate and up stored in formats that read differently quantized inputs (a
            // re-encoded tensor beside a native one): two stored projections, then SwiGLU.
            ws.up.resize(n * ffn, 0.0);
            crate::cpu::matmul(
                &mut [
                    Task {
                        matrix: &l.gate,
                        input: &ws.input,
                        output: Output::Store {
                            out: ws.mlp.reset(n, ffn),
                            bias: None,
                        },
                    },
                    Task {
                        matrix: &l.up,
                        input: &ws.input,
                        output: Output::Store {
                            out: &mut ws.up[..n * ffn],
                            bias: None,
                        },
                    },
                ],
                pool,
                isa,
            );
            let up = &ws.up;
            let gate = ws.mlp.reset_keeping(n, ffn);
            for_rows(gate, ffn, pool, isa, |r, row| {
                for (g, u) in row.iter_mut().zip(&up[r * ffn..(r + 1) * ffn]) {
                    *g = *g / (1.0 + crate::cpu::ops::exp(-*g)) * u;
                }
            });
        }
        project_residual(&l.down, &mut ws.mlp, &mut ws.proj, &mut ws.x, n, pool, isa);
    }
}

/// `x += input W^T` for a projection without bias (attention output, MLP down).
fn project_residual(
    matrix: &crate::cpu::PackedMatrix,
    input: &mut LayerInput,
    proj: &mut Vec<f32>,
    x: &mut [f32],
    n: usize,
    pool: &ThreadPool,
    isa: Isa,
) {
    let h = matrix.out_features();
    input.prepare_for(&[matrix], pool);
    proj.resize(n * h, 0.0);
    crate::cpu::matmul(
        &mut [Task {
            matrix,
            input,
            output: Output::Store {
                out: &mut proj[..n * h],
                bias: None,
            },
        }],
        pool,
        isa,
    );
    with_isa(isa, || add(&mut x[..n * h], &proj[..n * h]));
}

fn store<'a>(
    matrix: &'a crate::cpu::PackedMatrix,
    input: &'a LayerInput,
    out: &'a mut [f32],
    bias: &'a [f32],
) -> Task<'a> {
    Task {
        matrix,
        input,
        output: Output::Store {
            out,
            bias: Some(bias),
        },
    }
}
