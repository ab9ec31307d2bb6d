//! The engine's weights, read from the GGUF map and repacked into tiles.

use std::borrow::Cow;

use candle_core::quantized::{QStorage, QTensor};
use candle_core::Device;

use crate::cpu::{PackedMatrix, ThreadPool, WeightFormat};

use super::super::config::{Qwen2Config, RotaryPairs};
use super::super::error::{Qwen2Error, Result};
use super::super::rotary_rows::halves_from_adjacent;
use crate::gguf::{GgufError, GgufFile};
use crate::precision::MatrixPrecision;

/// A token embedding kept in its stored format; rows are decoded one at a time.
pub(crate) struct EmbeddingTable {
    pub format: WeightFormat,
    pub row_bytes: usize,
    pub data: Vec<u8>,
}

pub(crate) struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub q: PackedMatrix,
    pub k: PackedMatrix,
    pub v: PackedMatrix,
    pub q_bias: Vec<f32>,
    pub k_bias: Vec<f32>,
    pub v_bias: Vec<f32>,
    pub o: PackedMatrix,
    pub ffn_norm: Vec<f32>,
    pub gate: PackedMatrix,
    pub up: PackedMatrix,
    pub down: PackedMatrix,
}

pub(crate) struct Weights {
    pub embedding: EmbeddingTable,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    pub head: PackedMatrix,
    /// Matmul weights stored in a format without a native kernel, re-encoded at load.
    pub reencoded: usize,
    /// Matmul weights re-encoded narrower at load, as [`MatrixPrecision`] asked.
    pub narrowed: usize,
}

fn load_error(name: &str, message: impl std::fmt::Display) -> Qwen2Error {
    GgufError::TensorLoad {
        name: name.to_string(),
        source: candle_core::Error::Msg(message.to_string()),
    }
    .into()
}

struct Loader<'a> {
    gguf: &'a GgufFile,
    config: &'a Qwen2Config,
    pool: &'a ThreadPool,
    precision: MatrixPrecision,
    reencoded: usize,
    narrowed: usize,
}

impl<'a> Loader<'a> {
    /// A matmul weight's bytes in a format with a native kernel, in the precision the model
    /// was asked to run in: see [`Loader::native`] and [`MatrixPrecision`].
    fn matmul_weight(
        &mut self,
        name: &str,
        dims: &[usize],
    ) -> Result<(WeightFormat, Cow<'a, [u8]>)> {
        let (format, bytes) = self.native(name, dims)?;
        let inp = dims[dims.len() - 1];
        match self.precision.narrower(format, inp) {
            None => Ok((format, bytes)),
            Some(target) => {
                let encoded = self.encode(name, format.ggml(), dims, &bytes, target)?;
                tracing::debug!(tensor = name, from = ?format, to = ?target, "re-encoded to the requested precision");
                self.narrowed += 1;
                Ok((target, Cow::Owned(encoded)))
            }
        }
    }

    /// A weight's bytes in a format with a native kernel: borrowed from the file as
    /// stored, or re-encoded (Q8_0 where rows are whole 32-value blocks, else F32).
    fn native(&mut self, name: &str, dims: &[usize]) -> Result<(WeightFormat, Cow<'a, [u8]>)> {
        let raw = self.gguf.raw(name, dims)?;
        let inp = dims[dims.len() - 1];
        if let Some(format) = WeightFormat::from_ggml(raw.dtype) {
            if format.row_bytes(inp).is_some() {
                return Ok((format, Cow::Borrowed(raw.bytes)));
            }
        }
        let target = if inp.is_multiple_of(32) {
            WeightFormat::Q8_0
        } else {
            WeightFormat::F32
        };
        let encoded = self.encode(name, raw.dtype, dims, raw.bytes, target)?;
        tracing::info!(tensor = name, from = ?raw.dtype, to = ?target, "no native CPU kernel for this format; re-encoded");
        self.reencoded += 1;
        Ok((target, Cow::Owned(encoded)))
    }

    /// `bytes` of a `from` tensor decoded and encoded again as `target`.
    fn encode(
        &self,
        name: &str,
        from: candle_core::quantized::GgmlDType,
        dims: &[usize],
        bytes: &[u8],
        target: WeightFormat,
    ) -> Result<Vec<u8>> {
        let wrap = |source| Qwen2Error::Requantize {
            name: name.to_string(),
            from,
            source,
        };
        let stored = QTensor::new(
            QStorage::from_data(Cow::Borrowed(bytes), &Device::Cpu, from).map_err(wrap)?,
            dims.to_vec(),
        )
        .map_err(wrap)?;
        let dense = stored.dequantize(&Device::Cpu).map_err(wrap)?;
        let encoded = QTensor::quantize(&dense, target.ggml()).map_err(wrap)?;
        Ok(encoded.data().map_err(wrap)?.into_owned())
    }

    fn matrix(&mut self, name: &str, out: usize, inp: usize) -> Result<PackedMatrix> {
        let (format, bytes) = self.matmul_weight(name, &[out, inp])?;
        self.pack(name, format, out, inp, bytes)
    }

    /// A Q or K projection, its rows in the halves order the rotary embedding rotates.
    fn rotary_matrix(&mut self, name: &str, out: usize, inp: usize) -> Result<PackedMatrix> {
        let (format, bytes) = self.matmul_weight(name, &[out, inp])?;
        let bytes = match self.config.rotary_pairs() {
            RotaryPairs::Halves => bytes,
            RotaryPairs::Adjacent => {
                let row_bytes = format
                    .row_bytes(inp)
                    .ok_or_else(|| load_error(name, "rows are not whole blocks"))?;
                let head_dim = self.config.head_dim;
                Cow::Owned(halves_from_adjacent(name, &bytes, head_dim, row_bytes)?)
            }
        };
        self.pack(name, format, out, inp, bytes)
    }

    fn pack(
        &mut self,
        name: &str,
        format: WeightFormat,
        out: usize,
        inp: usize,
        bytes: Cow<'_, [u8]>,
    ) -> Result<PackedMatrix> {
        let packed = PackedMatrix::from_gguf(format, out, inp, &bytes, self.pool);
        self.gguf.release(name);
        packed.map_err(|e| load_error(name, e))
    }

    /// A SwiGLU's gate and up projections, with their tiles interleaved in one allocation
    /// where they share a format (each worker then reads one stream of memory).
    fn gate_up(&mut self, layer: usize, out: usize, inp: usize) -> Result<[PackedMatrix; 2]> {
        let names = [
            format!("blk.{layer}.ffn_gate.weight"),
            format!("blk.{layer}.ffn_up.weight"),
        ];
        let (gate_format, gate) = self.matmul_weight(&names[0], &[out, inp])?;
        let (up_format, up) = self.matmul_weight(&names[1], &[out, inp])?;
        let pool = self.pool;
        let packed = if gate_format == up_format {
            PackedMatrix::interleaved_from_gguf(gate_format, out, inp, [&gate, &up], pool)
                .map_err(|e| load_error(&names[0], e))?
        } else {
            let pack = |name: &str, format, bytes: &[u8]| {
                PackedMatrix::from_gguf(format, out, inp, bytes, pool)
                    .map_err(|e| load_error(name, e))
            };
            [
                pack(&names[0], gate_format, &gate)?,
                pack(&names[1], up_format, &up)?,
            ]
        };
        for name in &names {
            self.gguf.release(name);
        }
        Ok(packed)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let raw = self.gguf.raw(name, &[len])?;
        let format = WeightFormat::from_ggml(raw.dtype)
            .filter(|f| f.row_bytes(len).is_some())
            .ok_or_else(|| load_error(name, format!("a vector stored as {:?}", raw.dtype)))?;
        let mut out = vec![0f32; len];
        crate::cpu::dequantize_row(format, raw.bytes, &mut out);
        Ok(out)
    }

    fn bias(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        if self.gguf.has_tensor(name) {
            self.vector(name, len)
        } else {
            Ok(vec![0.0; len])
        }
    }

    /// A Q or K bias, in the order of [`Loader::rotary_matrix`]'s rows.
    fn rotary_bias(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let bias = self.bias(name, len)?;
        match self.config.rotary_pairs() {
            RotaryPairs::Halves => Ok(bias),
            RotaryPairs::Adjacent => halves_from_adjacent(name, &bias, self.config.head_dim, 1),
        }
    }

    fn embedding(&mut self, vocab: usize, hidden: usize) -> Result<EmbeddingTable> {
        let name = "token_embd.weight";
        let (format, data) = self.native(name, &[vocab, hidden])?;
        let data = data.into_owned();
        self.gguf.release(name);
        let row_bytes = format
            .row_bytes(hidden)
            .ok_or_else(|| load_error(name, "rows are not whole blocks"))?;
        Ok(EmbeddingTable {
            format,
            row_bytes,
            data,
        })
    }
}

impl Weights {
    pub(crate) fn load(
        gguf: &GgufFile,
        config: &Qwen2Config,
        precision: MatrixPrecision,
        pool: &ThreadPool,
    ) -> Result<Self> {
        let mut l = Loader {
            gguf,
            config,
            pool,
            precision,
            reencoded: 0,
            narrowed: 0,
        };
        let (hidden, kv, ffn, vocab) = (
            config.hidden_size,
            config.kv_dim(),
            config.intermediate_size,
            config.vocab_size,
        );
        let embedding = l.embedding(vocab, hidden)?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = |n: &str| format!("blk.{i}.{n}");
            let [gate, up] = l.gate_up(i, ffn, hidden)?;
            layers.push(LayerWeights {
                attn_norm: l.vector(&p("attn_norm.weight"), hidden)?,
                q: l.rotary_matrix(&p("attn_q.weight"), hidden, hidden)?,
                k: l.rotary_matrix(&p("attn_k.weight"), kv, hidden)?,
                v: l.matrix(&p("attn_v.weight"), kv, hidden)?,
                q_bias: l.rotary_bias(&p("attn_q.bias"), hidden)?,
                k_bias: l.rotary_bias(&p("attn_k.bias"), kv)?,
                v_bias: l.bias(&p("attn_v.bias"), kv)?,
                o: l.matrix(&p("attn_output.weight"), hidden, hidden)?,
                ffn_norm: l.vector(&p("ffn_norm.weight"), hidden)?,
                gate,
                up,
                down: l.matrix(&p("ffn_down.weight"), hidden, ffn)?,
            });
        }
        let output_norm = l.vector("output_norm.weight", hidden)?;
        let head_name = if gguf.has_tensor("output.weight") {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let head = l.matrix(head_name, vocab, hidden)?;
        Ok(Self {
            embedding,
            layers,
            output_norm,
            head,
            reencoded: l.reencoded,
            narrowed: l.narrowed,
        })
    }

    /// Bytes one decode step streams: every matmul weight once.
    pub(crate) fn streamed_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|m| m.bytes())
                    .sum::<usize>()
            })
            .sum();
        layers + self.head.bytes()
    }

    /// Bytes held in memory by the weights.
    pub(crate) fn resident_bytes(&self) -> usize {
        self.streamed_bytes() + self.embedding.data.len()
    }
}
