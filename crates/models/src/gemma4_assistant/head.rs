//! The assistant's LM heads: a dense projection onto the vocabulary, or the centroid
//! ("ordered embeddings") head that scores only the tokens of the best-scoring clusters.

use candle_core::{DType, Device, Tensor};

use super::config::Gemma4AssistantConfig;
use crate::causal_lm::{top_two_with, TopTwo};
use crate::checkpoint::Checkpoint;
use crate::error::{ModelError, Result};
use crate::linear::Linear;
use crate::projection::{pack_rows, Projection};

/// What the centroid head scored for one hidden state.
#[derive(Debug, Clone, PartialEq)]
pub struct CentroidSelection {
    /// The top-k clusters, best first.
    pub centroids: Vec<u32>,
    /// The token ids scored: each chosen cluster's row of `token_ordering`, in cluster order.
    pub token_ids: Vec<u32>,
    /// The logit of each id in `token_ids`.
    pub logits: Vec<f32>,
}

impl CentroidSelection {
    /// The best scored token; on a tie the lower id, as an argmax over the full vocabulary
    /// would pick.
    pub fn argmax(&self) -> Option<u32> {
        let mut best: Option<(f32, u32)> = None;
        for (&id, &logit) in self.token_ids.iter().zip(&self.logits) {
            let better = match best {
                None => !logit.is_nan(),
                Some((b, bid)) => logit > b || (logit == b && id < bid),
            };
            if better {
                best = Some((logit, id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// The full-vocabulary logits transformers builds: the scored logits in place, every other
    /// token at the smallest scored logit minus one.
    pub fn full_logits(&self, vocab_size: usize) -> Vec<f32> {
        let min = self.logits.iter().copied().fold(f32::INFINITY, f32::min);
        // transformers takes the minimum as a Python float, subtracts 1 and casts back.
        let fill = (min as f64 - 1.0) as f32;
        let mut out = vec![fill; vocab_size];
        for (&id, &logit) in self.token_ids.iter().zip(&self.logits) {
            out[id as usize] = logit;
        }
        out
    }
}

pub struct CentroidHead {
    centroids: Linear,
    /// The token matrix `[vocab, hidden]` the selected ids are scored against.
    tokens: Tensor,
    /// `token_ordering`: cluster `c` owns ids `ordering[c * per_cluster .. (c + 1) * per_cluster]`.
    ordering: Vec<u32>,
    per_cluster: usize,
    top_k: usize,
}

impl CentroidHead {
    fn load(ckpt: &Checkpoint, cfg: &Gemma4AssistantConfig, tokens: Tensor) -> Result<Self> {
        let (v, h, c) = (cfg.text.vocab_size, cfg.hidden_size(), cfg.num_centroids);
        let name = "masked_embedding.token_ordering";
        let raw = ckpt
            .tensor_as(name, &[v], DType::I64)?
            .to_device(&Device::Cpu)?
            .to_vec1::<i64>()?;
        let ordering = raw
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                u32::try_from(id)
                    .ok()
                    .filter(|&id| (id as usize) < v)
                    .ok_or_else(|| {
                        ModelError::Invalid(format!(
                            "tensor {name}[{i}]: token id {id} is outside the vocabulary 0..{v}"
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            centroids: Linear::load(ckpt, "masked_embedding.centroids", c, h, false)?,
            tokens,
            ordering,
            per_cluster: v / c,
            top_k: cfg.centroid_intermediate_top_k,
        })
    }

    pub fn select(&self, normed: &Tensor, exact: bool) -> Result<CentroidSelection> {
        let scores = self
            .centroids
            .forward(normed, exact)?
            .flatten_all()?
            .to_dtype(DType::F32)?
            .to_vec1::<f32>()?;
        let mut order: Vec<u32> = (0..scores.len() as u32).collect();
        // Descending score, ties to the lower index; NaN scores sort last.
        order.sort_by(|&a, &b| {
            let (x, y) = (scores[a as usize], scores[b as usize]);
            y.partial_cmp(&x)
                .unwrap_or_else(|| x.is_nan().cmp(&y.is_nan()))
                .then(a.cmp(&b))
        });
        order.truncate(self.top_k);
        let token_ids: Vec<u32> = order
            .iter()
            .flat_map(|&c| {
                let first = c as usize * self.per_cluster;
                self.ordering[first..first + self.per_cluster]
                    .iter()
                    .copied()
            })
            .collect();
        let ids = Tensor::new(token_ids.as_slice(), self.tokens.device())?;
        let rows = Linear::new(self.tokens.index_select(&ids, 0)?, None);
        let logits = rows
            .forward(normed, exact)?
            .flatten_all()?
            .to_dtype(DType::F32)?
            .to_vec1::<f32>()?;
        Ok(CentroidSelection {
            centroids: order,
            token_ids,
            logits,
        })
    }
}

pub enum Head {
    Dense(Projection),
    Centroid(CentroidHead),
}

impl Head {
    /// The tied or separate head, wrapped by the centroid selection when the checkpoint uses
    /// ordered embeddings.
    pub fn load(ckpt: &Checkpoint, cfg: &Gemma4AssistantConfig) -> Result<Self> {
        let (v, h) = (cfg.text.vocab_size, cfg.hidden_size());
        let embed = "model.embed_tokens.weight";
        let name = if cfg.tie_word_embeddings && ckpt.contains(embed) {
            embed
        } else if ckpt.contains("lm_head.weight") {
            "lm_head.weight"
        } else {
            let missing = if cfg.tie_word_embeddings {
                embed
            } else {
                "lm_head.weight"
            };
            return Err(ModelError::MissingTensor {
                name: missing.into(),
            });
        };
        if !cfg.use_ordered_embeddings {
            // A head the CPU engine takes as stored runs on its kernels.
            if let Some(stored) = ckpt.packable(name, &[v, h])? {
                let packed = pack_rows(ckpt, name, &stored, 0, v)?;
                ckpt.release(name);
                return Ok(Self::Dense(packed.into()));
            }
        }
        let weight = ckpt.tensor(name, &[v, h])?;
        Ok(if cfg.use_ordered_embeddings {
            Self::Centroid(CentroidHead::load(ckpt, cfg, weight)?)
        } else {
            Self::Dense(Linear::new(weight, None).into())
        })
    }

    /// Full-vocabulary logits (for the centroid head, the sparse vector transformers builds).
    pub fn logits(&self, normed: &Tensor, vocab_size: usize, exact: bool) -> Result<Vec<f32>> {
        match self {
            Self::Dense(lm_head) => Ok(lm_head
                .forward(normed, exact)?
                .flatten_all()?
                .to_dtype(DType::F32)?
                .to_vec1::<f32>()?),
            Self::Centroid(head) => Ok(head.select(normed, exact)?.full_logits(vocab_size)),
        }
    }

    /// The greedy token; the centroid head scores only its selected tokens.
    pub fn argmax(&self, normed: &Tensor, vocab_size: usize, exact: bool) -> Result<u32> {
        let best = match self {
            // A packed head's argmax epilogue keeps first_argmax's order and stores no logits.
            Self::Dense(lm_head) => match lm_head.best_two(normed, vocab_size)?.as_deref() {
                Some([[(id, _), _]]) => (*id != u32::MAX).then_some(*id),
                _ => first_argmax(&self.logits(normed, vocab_size, exact)?),
            },
            Self::Centroid(head) => head.select(normed, exact)?.argmax(),
        };
        best.ok_or_else(|| ModelError::Invalid("every drafter logit is NaN".into()))
    }

    /// [`Self::argmax`] (the same token) and the runner-up among the tokens the head
    /// scores, each with its logit.
    pub fn top_two(&self, normed: &Tensor, vocab_size: usize, exact: bool) -> Result<TopTwo> {
        let nan = || ModelError::Invalid("every drafter logit is NaN".into());
        match self {
            Self::Dense(lm_head) => match lm_head.best_two(normed, vocab_size)?.as_deref() {
                Some([[best, second]]) if best.0 != u32::MAX => Ok(TopTwo {
                    best: *best,
                    runner_up: (second.0 != u32::MAX).then_some(*second),
                }),
                _ => {
                    let logits = self.logits(normed, vocab_size, exact)?;
                    let best = first_argmax(&logits).ok_or_else(nan)?;
                    Ok(top_two_with(best, &logits))
                }
            },
            Self::Centroid(head) => {
                let selection = head.select(normed, exact)?;
                let best = selection.argmax().ok_or_else(nan)?;
                let scored = || {
                    selection
                        .token_ids
                        .iter()
                        .copied()
                        .zip(selection.logits.iter().copied())
                };
                let logit = scored()
                    .find(|&(id, _)| id == best)
                    .map_or(f32::NAN, |s| s.1);
                let runner_up = scored().filter(|&(id, x)| id != best && !x.is_nan()).fold(
                    None,
                    |b: Option<(u32, f32)>, (id, x)| match b {
                        Some((bid, bx)) if bx > x || (bx == x && bid < id) => b,
                        _ => Some((id, x)),
                    },
                );
                Ok(TopTwo {
                    best: (best, logit),
                    runner_up,
                })
            }
        }
    }
}

/// Index of the largest value, the first on a tie; NaN never wins.
pub fn first_argmax(values: &[f32]) -> Option<u32> {
    let mut best: Option<(f32, usize)> = None;
    for (i, &x) in values.iter().enumerate() {
        if best.is_none_or(|(b, _)| x > b) && !x.is_nan() {
            best = Some((x, i));
        }
    }
    best.map(|(_, i)| i as u32)
}
