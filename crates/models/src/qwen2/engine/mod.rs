//! The CPU engine for Qwen2 / Llama GGUF models: packed weights and the crate's own
//! kernels (see [`crate::cpu`]), one thread pool, a preallocated workspace.
//!
//! Every token's hidden state, logits and K/V are computed by the same operations whether
//! it runs alone, in a verify block, beside other sequences or in a prefill chunk.

mod forward;
mod weights;

use std::sync::Mutex;

use crate::causal_lm::TopTwo;
use crate::cpu::{Isa, KvBuffers, Output, Task, ThreadPool};

use super::config::Qwen2Config;
use super::error::Result;
use crate::blocks::rope::RotaryTable;
use crate::gguf::GgufFile;
use crate::precision::MatrixPrecision;
use forward::Workspace;
use weights::Weights;

pub(crate) struct Engine {
    config: Qwen2Config,
    weights: Weights,
    rope: RotaryTable,
    pool: &'static ThreadPool,
    isa: Isa,
    workspace: Mutex<Workspace>,
}

/// One sequence of a packed forward: its new tokens, its K/V and how many positions of it
/// are already valid.
pub(crate) struct EngineRow<'a> {
    pub tokens: &'a [u32],
    /// The tree whose last nodes the tokens are (see [`crate::tree`]); empty: a chain.
    pub parents: &'a [u32],
    pub kv: &'a mut KvBuffers,
    pub past: usize,
}

impl AsRef<KvBuffers> for EngineRow<'_> {
    fn as_ref(&self) -> &KvBuffers {
        self.kv
    }
}

impl Engine {
    pub(crate) fn load(
        gguf: &GgufFile,
        config: Qwen2Config,
        precision: MatrixPrecision,
    ) -> Result<Self> {
        let pool = ThreadPool::global();
        let weights = Weights::load(gguf, &config, precision, pool)?;
        Ok(Self {
            rope: config.rotary_table(),
            config,
            weights,
            pool,
            isa: Isa::active(),
            workspace: Mutex::new(Workspace::default()),
        })
    }

    pub(crate) fn isa(&self) -> Isa {
        self.isa
    }

    pub(crate) fn threads(&self) -> usize {
        self.pool.threads()
    }

    pub(crate) fn reencoded(&self) -> usize {
        self.weights.reencoded
    }

    pub(crate) fn narrowed(&self) -> usize {
        self.weights.narrowed
    }

    pub(crate) fn streamed_bytes(&self) -> usize {
        self.weights.streamed_bytes()
    }

    pub(crate) fn resident_bytes(&self) -> usize {
        self.weights.resident_bytes()
    }

    fn workspace(&self) -> std::sync::MutexGuard<'_, Workspace> {
        self.workspace.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs the rows (their caches must have room) and returns the final-normed hidden
    /// states of all their tokens, `[tokens, hidden]`, rows in order.
    pub(crate) fn forward(&self, rows: &mut [EngineRow<'_>]) -> Vec<f32> {
        let mut ws = self.workspace();
        self.forward_into(rows, &mut ws)
    }

    /// Logits `[n, vocab]` of final-normed hidden states `[n, hidden]`.
    pub(crate) fn logits(&self, hidden: &[f32]) -> Vec<f32> {
        let n = hidden.len() / self.config.hidden_size;
        let mut logits = vec![0f32; n * self.config.vocab_size];
        self.head(
            hidden,
            Output::Store {
                out: &mut logits,
                bias: None,
            },
        );
        logits
    }

    /// The greedy token among ids below `below` of each hidden state (the lowest id among
    /// equal logits), without materialising the logits; the head's rows past `below` are
    /// not read.
    pub(crate) fn argmax(&self, hidden: &[f32], below: usize) -> Vec<u32> {
        let n = hidden.len() / self.config.hidden_size;
        let mut best = vec![(0u32, 0f32); n];
        let below = below.clamp(1, self.config.vocab_size);
        self.head(
            hidden,
            Output::Argmax {
                best: &mut best,
                runner_up: None,
                below,
            },
        );
        best.into_iter().map(|(i, _)| i).collect()
    }

    /// [`Self::argmax`] and the runner-up of each hidden state, with their logits; the same
    /// greedy tokens, from the same single pass over the head.
    pub(crate) fn top_two(&self, hidden: &[f32], below: usize) -> Vec<TopTwo> {
        let n = hidden.len() / self.config.hidden_size;
        let mut best = vec![(0u32, 0f32); n];
        let mut runner_up = vec![(0u32, 0f32); n];
        let below = below.clamp(1, self.config.vocab_size);
        self.head(
            hidden,
            Output::Argmax {
                best: &mut best,
                runner_up: Some(&mut runner_up),
                below,
            },
        );
        best.into_iter()
            .zip(runner_up)
            .map(|(best, second)| TopTwo {
                best,
                runner_up: (second.0 != u32::MAX).then_some(second),
            })
            .collect()
    }

    /// The LM head over hidden states `[n, hidden]` into `output`.
    fn head(&self, hidden: &[f32], output: Output<'_>) {
        let h = self.config.hidden_size;
        let n = hidden.len() / h;
        let mut ws = self.workspace();
        ws.head.reset(n, h).copy_from_slice(&hidden[..n * h]);
        ws.head.prepare_for(&[&self.weights.head], self.pool);
        crate::cpu::matmul(
            &mut [Task {
                matrix: &self.weights.head,
                input: &ws.head,
                output,
            }],
            self.pool,
            self.isa,
        );
    }
}
