//! The mixture-of-experts block of a Gemma 4 layer (`enable_moe_block`), as transformers 5.23
//! runs it beside the dense MLP:
//!
//! 1. a router on the residual: RMS-normed without weight, times `router.scale` and
//!    `hidden_size^-0.5`, projected to one score per expert, softmax in f32, the top-k
//!    experts, their probabilities renormalised to sum to 1, then times each expert's
//!    `per_expert_scale`;
//! 2. each chosen expert on `pre_feedforward_layernorm_2(residual)`: GeGLU (`gate_up_proj`
//!    holds the gate rows, then the up rows) and `down_proj`, times its weight, summed over
//!    the chosen experts in ascending expert order;
//! 3. `post_feedforward_layernorm_1(mlp) + post_feedforward_layernorm_2(experts)`, which the
//!    layer then norms with `post_feedforward_layernorm` as it does a dense MLP's output.
//!
//! Every row routes on its own scores, and each expert's rows go through the same row-exact
//! kernels as the dense layers, so a token's experts and output do not depend on what else
//! is in the batch.

use candle_core::{DType, Tensor};

use super::config::MoeConfig;
use super::norm::RmsNorm;
use crate::checkpoint::Checkpoint;
use crate::error::{ModelError, Result};
use crate::linear::Linear;
use crate::projection::{pack_rows, Projection};

struct Expert {
    gate: Projection,
    up: Projection,
    down: Projection,
}

pub(crate) struct MoeBlock {
    top_k: usize,
    router_norm: RmsNorm,
    /// `router.scale` `[hidden]`.
    router_scale: Tensor,
    /// `hidden_size^-0.5`.
    root_size: f64,
    router: Projection,
    per_expert_scale: Vec<f32>,
    experts: Vec<Expert>,
    pre_norm: RmsNorm,
    post_norm_mlp: RmsNorm,
    post_norm_experts: RmsNorm,
}

/// One row's chosen experts and their weights, in ascending expert order.
type Routes = Vec<(usize, f32)>;

impl MoeBlock {
    /// Loads the router, the experts and the three extra norms of layer prefix `p`.
    pub(crate) fn load(
        ckpt: &Checkpoint,
        p: &str,
        moe: MoeConfig,
        hidden: usize,
        eps: f64,
    ) -> Result<Self> {
        let (e, i) = (moe.num_experts, moe.intermediate_size);
        let norm = |name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(
                ckpt.tensor(&format!("{p}.{name}.weight"), &[hidden])?,
                eps,
            ))
        };
        let (gate_up_name, down_name) = (
            format!("{p}.experts.gate_up_proj"),
            format!("{p}.experts.down_proj"),
        );
        let gate_up = ExpertWeights::load(ckpt, &gate_up_name, [e, 2 * i, hidden])?;
        let down = ExpertWeights::load(ckpt, &down_name, [e, hidden, i])?;
        let experts = (0..e)
            .map(|x| -> Result<Expert> {
                Ok(Expert {
                    gate: gate_up.rows(ckpt, x, 0, i)?,
                    up: gate_up.rows(ckpt, x, i, i)?,
                    down: down.rows(ckpt, x, 0, hidden)?,
                })
            })
            .collect::<Result<_>>()?;
        ckpt.release(&gate_up_name);
        ckpt.release(&down_name);
        let per_expert_scale = ckpt
            .tensor_as(&format!("{p}.router.per_expert_scale"), &[e], DType::F32)?
            .to_vec1::<f32>()?;
        Ok(Self {
            top_k: moe.top_k,
            router_norm: RmsNorm::unscaled(eps),
            router_scale: ckpt.tensor(&format!("{p}.router.scale"), &[hidden])?,
            root_size: (hidden as f64).powf(-0.5),
            router: Projection::load(ckpt, &format!("{p}.router.proj"), e, hidden, false)?,
            per_expert_scale,
            experts,
            pre_norm: norm("pre_feedforward_layernorm_2")?,
            post_norm_mlp: norm("post_feedforward_layernorm_1")?,
            post_norm_experts: norm("post_feedforward_layernorm_2")?,
        })
    }

    /// The feed-forward output of a MoE layer from its `residual` `[n, hidden]` (the input
    /// of the feed-forward half) and its dense MLP's output `mlp`.
    pub(crate) fn forward(&self, residual: &Tensor, mlp: &Tensor, exact: bool) -> Result<Tensor> {
        let routes = self.route(residual, exact)?;
        let x = self.pre_norm.forward(residual)?;
        let mut sum = x.zeros_like()?;
        for (index, expert) in self.experts.iter().enumerate() {
            let (rows, weights): (Vec<u32>, Vec<f32>) = routes
                .iter()
                .enumerate()
                .filter_map(|(r, chosen)| {
                    chosen
                        .iter()
                        .find(|(e, _)| *e == index)
                        .map(|&(_, w)| (r as u32, w))
                })
                .unzip();
            if rows.is_empty() {
                continue;
            }
            let m = rows.len();
            let rows = Tensor::from_vec(rows, m, x.device())?;
            let xe = x.index_select(&rows, 0)?;
            let act =
                (expert.gate.forward(&xe, exact)?.gelu()? * expert.up.forward(&xe, exact)?)?;
            let out = expert.down.forward(&act, exact)?;
            let weights = Tensor::from_vec(weights, (m, 1), x.device())?;
            let weighted = out
                .to_dtype(DType::F32)?
                .broadcast_mul(&weights)?
                .to_dtype(x.dtype())?;
            // Experts add in ascending order, each row starting from zero, as transformers'
            // `index_add_` loop does.
            sum = sum.index_add(&rows, &weighted, 0)?;
        }
        Ok((self.post_norm_mlp.forward(mlp)? + self.post_norm_experts.forward(&sum)?)?)
    }

    /// Each row's experts and weights.
    fn route(&self, residual: &Tensor, exact: bool) -> Result<Vec<Routes>> {
        let x = self
            .router_norm
            .forward(residual)?
            .broadcast_mul(&self.router_scale)?;
        let x = (x * self.root_size)?;
        let scores = self
            .router
            .forward(&x, exact)?
            .to_dtype(DType::F32)?
            .to_vec2::<f32>()?;
        scores.iter().map(|row| self.top_k_of(row)).collect()
    }

    /// The top-k experts of one row of router scores (the lower index first among equal
    /// probabilities), weighted as transformers weighs them.
    fn top_k_of(&self, scores: &[f32]) -> Result<Routes> {
        let probs = softmax(scores);
        let mut order: Vec<usize> = (0..probs.len()).collect();
        // NaN scores cannot be ranked; refuse them rather than route on them.
        if probs.iter().any(|p| p.is_nan()) {
            return Err(ModelError::Invalid(
                "the MoE router produced NaN probabilities".into(),
            ));
        }
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        order.truncate(self.top_k);
        let total: f32 = order.iter().map(|&e| probs[e]).sum();
        let mut routes: Routes = order
            .into_iter()
            .map(|e| (e, probs[e] / total * self.per_expert_scale[e]))
            .collect();
        routes.sort_by_key(|&(e, _)| e);
        Ok(routes)
    }
}

/// One of a layer's 3-D expert weights `[experts, out, in]`, as the checkpoint stores it.
enum ExpertWeights<'a> {
    Dense(Tensor),
    Stored {
        name: String,
        stored: crate::checkpoint::StoredMatrix<'a>,
    },
}

impl<'a> ExpertWeights<'a> {
    fn load(ckpt: &'a Checkpoint, name: &str, dims: [usize; 3]) -> Result<Self> {
        Ok(match ckpt.packable(name, &dims)? {
            Some(stored) => Self::Stored {
                name: name.to_string(),
                stored,
            },
            None => Self::Dense(ckpt.tensor(name, &dims)?),
        })
    }

    /// Rows `first .. first + count` of expert `x`'s `[out, in]` slice as a projection: a
    /// stored one packed on its own, so each expert reads only its own tiles.
    fn rows(&self, ckpt: &Checkpoint, x: usize, first: usize, count: usize) -> Result<Projection> {
        Ok(match self {
            Self::Dense(all) => {
                let slice = all.narrow(0, x, 1)?.squeeze(0)?;
                Linear::new(slice.narrow(0, first, count)?.contiguous()?, None).into()
            }
            Self::Stored { name, stored } => {
                let out = stored.dims[1];
                pack_rows(ckpt, name, stored, x * out + first, count)?.into()
            }
        })
    }
}

/// Softmax in f32: shifted by the maximum, as torch computes it.
fn softmax(scores: &[f32]) -> Vec<f32> {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_keeps_the_order() {
        let p = softmax(&[1.0, 3.0, 2.0]);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(p[1] > p[2] && p[2] > p[0]);
    }
}
