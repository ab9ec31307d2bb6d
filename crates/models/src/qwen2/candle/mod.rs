//! Qwen2 on candle's tensors and quantized matmuls: the path for CUDA and Metal devices.
//! (On CPU the crate's own engine runs instead; this path is kept runnable there as an
//! independent reference for tests and benchmarks.)

mod attend;
mod attention;
mod cache;
mod layer;
mod linear;

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};

use super::config::Qwen2Config;
use super::error::Result;
use crate::blocks::rope::RotaryTable;
use crate::cpu::Span;
use crate::exact::TreeQueries;
use crate::gguf::GgufFile;
pub(crate) use cache::DeviceKv;
use layer::{DecoderLayer, LoadContext};
use linear::QLinear;

enum Embedding {
    /// Rows are dequantized on lookup.
    Quantized(QTensor),
    /// Used when the row length is not a whole number of quantization blocks.
    Dense(Tensor),
}

pub(crate) struct CandleQwen2 {
    embedding: Embedding,
    layers: Vec<DecoderLayer>,
    output_norm: Tensor,
    lm_head: QLinear,
    rope: RotaryTable,
    eps: f64,
    device: Device,
}

/// One sequence of a packed forward.
pub(crate) struct CandleRow<'a> {
    pub tokens: &'a [u32],
    /// The tree whose last nodes the tokens are (see [`crate::tree`]); empty: a chain.
    pub parents: &'a [u32],
    pub kv: &'a DeviceKv,
    pub past: usize,
}

impl CandleRow<'_> {
    /// The tree the row's tokens are the last nodes of; `None` for a chain.
    fn tree(&self) -> Option<TreeQueries> {
        (!self.parents.is_empty())
            .then(|| TreeQueries::new(self.parents, self.tokens.len(), self.past))
    }
}

impl CandleQwen2 {
    pub(crate) fn load(gguf: &mut GgufFile, config: &Qwen2Config, device: &Device) -> Result<Self> {
        let (vocab_size, hidden) = (config.vocab_size, config.hidden_size);
        let embed = gguf.qtensor("token_embd.weight", &[vocab_size, hidden], device)?;
        let embedding = if hidden % embed.dtype().block_size() == 0 {
            Embedding::Quantized(embed)
        } else {
            Embedding::Dense(embed.dequantize(device)?)
        };
        let mut ctx = LoadContext { gguf, device };
        let layers = (0..config.num_layers)
            .map(|i| DecoderLayer::load(&mut ctx, i, config))
            .collect::<Result<Vec<_>>>()?;
        let output_norm = ctx.norm("output_norm", hidden)?;
        let lm_head = if ctx.gguf.has_tensor("output.weight") {
            ctx.linear("output", vocab_size, hidden, false)?
        } else {
            // Tied head: the embedding matrix again, as a matmul weight of its own.
            let weight = ctx
                .gguf
                .qtensor("token_embd.weight", &[vocab_size, hidden], device)?;
            QLinear::new(weight, None)?
        };
        Ok(Self {
            embedding,
            layers,
            output_norm,
            lm_head,
            rope: config.rotary_table(),
            eps: config.rms_norm_eps,
            device: device.clone(),
        })
    }

    /// The packed forward: all rows' tokens as one `[tokens, hidden]` matrix, so every matmul
    /// runs once for the whole batch; only attention looks at row boundaries. Returns the
    /// final-normed hidden states.
    pub(crate) fn forward(&self, rows: &[CandleRow<'_>]) -> Result<Tensor> {
        let spans = Span::pack(rows.iter().map(|row| (row.tokens.len(), row.past)));
        let ids: Vec<u32> = rows.iter().flat_map(|row| row.tokens).copied().collect();
        let positions: Vec<usize> = spans
            .iter()
            .zip(rows)
            .flat_map(|(span, row)| crate::tree::positions(row.parents, span.len, span.past))
            .collect();
        let trees: Vec<Option<TreeQueries>> = rows.iter().map(CandleRow::tree).collect();
        let ids = Tensor::new(ids.as_slice(), &self.device)?;
        let mut x = match &self.embedding {
            Embedding::Quantized(q) => q.embedding(&ids)?,
            Embedding::Dense(t) => t.index_select(&ids, 0)?,
        };
        let cos_sin = self.rope.tensors(&positions, DType::F32, &self.device)?;
        let caches: Vec<&DeviceKv> = rows.iter().map(|r| r.kv).collect();
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x, &cos_sin, &spans, &trees, &caches, i)?;
        }
        Ok(candle_nn::ops::rms_norm(
            &x,
            &self.output_norm,
            self.eps as f32,
        )?)
    }

    pub(crate) fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(hidden)
    }
}
