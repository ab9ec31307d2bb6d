//! Model hyper-parameters, read from the `{architecture}.*` GGUF metadata of a Llama-style
//! architecture: one entry of [`ARCHITECTURES`] each.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use super::error::{Qwen2Error, Result};

/// How a GGUF file pairs the dimensions of a head that rotary embedding rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotaryPairs {
    /// Dimension `i` with `i + head_dim / 2`, as Hugging Face's `rotate_half` (llama.cpp's
    /// NeoX rope): the file's Q/K rows are in the checkpoint's order.
    Halves,
    /// Dimension `2i` with `2i + 1` (llama.cpp's normal rope): llama.cpp's converter permuted
    /// each head's Q/K rows so; the loader puts them back in halves order.
    Adjacent,
}

/// A Llama-style architecture the engine runs, by its `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Architecture {
    pub name: &'static str,
    pub rotary_pairs: RotaryPairs,
}

/// Every architecture the engine runs: a dense decoder of pre-norm attention (Q/K/V biases
/// optional) and SwiGLU blocks, with RMSNorm and rotary embeddings. Adding one that differs
/// only in these is one line here.
pub const ARCHITECTURES: [Architecture; 2] = [
    Architecture {
        name: "qwen2",
        rotary_pairs: RotaryPairs::Halves,
    },
    Architecture {
        name: "llama",
        rotary_pairs: RotaryPairs::Adjacent,
    },
];

/// The entry of [`ARCHITECTURES`] named `name`.
pub fn architecture(name: &str) -> Option<&'static Architecture> {
    ARCHITECTURES.iter().find(|a| a.name == name)
}

#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2Config {
    pub architecture: &'static Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub context_length: usize,
    /// Llama 3's per-frequency divisors of the rotary angles (`rope_freqs.weight`); empty
    /// where the file has none.
    pub rope_freq_factors: Vec<f64>,
}

impl Qwen2Config {
    /// Reads the config; `vocab_size` comes from the token embedding's row count.
    pub fn from_metadata(metadata: &HashMap<String, Value>, vocab_size: usize) -> Result<Self> {
        let name = meta_str(metadata, "general.architecture")?;
        let architecture = architecture(name).ok_or_else(|| {
            let known: Vec<&str> = ARCHITECTURES.iter().map(|a| a.name).collect();
            Qwen2Error::field(
                "general.architecture",
                format!("expected one of {known:?}, found {name:?}"),
            )
        })?;
        let key = |field: &str| format!("{}.{field}", architecture.name);
        let hidden_size = meta_usize(metadata, &key("embedding_length"))?;
        let num_heads = meta_usize(metadata, &key("attention.head_count"))?;
        let num_kv_heads = meta_usize(metadata, &key("attention.head_count_kv"))?;
        let config = Self {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: meta_usize(metadata, &key("feed_forward_length"))?,
            num_layers: meta_usize(metadata, &key("block_count"))?,
            num_heads,
            num_kv_heads,
            head_dim: hidden_size.checked_div(num_heads).unwrap_or(0),
            rms_norm_eps: meta_f64(metadata, &key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: meta_f64_or(metadata, &key("rope.freq_base"), 10_000.0)?,
            context_length: meta_usize(metadata, &key("context_length"))?,
            rope_freq_factors: Vec::new(),
        };
        config.validate()?;
        // Heads of another width than embedding_length / head_count, or rotary embedding on
        // part of a head, are other architectures.
        for field in [
            "attention.key_length",
            "attention.value_length",
            "rope.dimension_count",
        ] {
            if metadata.contains_key(&key(field)) {
                let width = meta_usize(metadata, &key(field))?;
                if width != config.head_dim {
                    return Err(Qwen2Error::field(
                        &key(field),
                        format!(
                            "{width}, but embedding_length / attention.head_count is {} \
                             (unsupported)",
                            config.head_dim
                        ),
                    ));
                }
            }
        }
        Ok(config)
    }

    /// [`Self::inv_freq`] as the table both the engine and the candle path rotate by
    /// (angles in f64, rounded to f32).
    pub(crate) fn rotary_table(&self) -> crate::blocks::rope::RotaryTable {
        crate::blocks::rope::RotaryTable::F64(self.inv_freq())
    }

    /// The rotary angle per position of each of a head's `head_dim / 2` pairs.
    pub fn inv_freq(&self) -> Vec<f64> {
        (0..self.head_dim / 2)
            .map(|i| {
                let base = self
                    .rope_theta
                    .powf(-((2 * i) as f64) / self.head_dim as f64);
                base / self.rope_freq_factors.get(i).copied().unwrap_or(1.0)
            })
            .collect()
    }

    fn validate(&self) -> Result<()> {
        let key = |name: &str| format!("{}.{name}", self.architecture.name);
        let positive = [
            ("embedding_length", self.hidden_size),
            ("feed_forward_length", self.intermediate_size),
            ("block_count", self.num_layers),
            ("attention.head_count", self.num_heads),
            ("attention.head_count_kv", self.num_kv_heads),
            ("context_length", self.context_length),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(Qwen2Error::field(&key(name), "must be positive"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_heads) {
            return Err(Qwen2Error::field(
                &key("attention.head_count"),
                format!(
                    "{} heads do not divide embedding_length {}",
                    self.num_heads, self.hidden_size
                ),
            ));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(Qwen2Error::field(
                &key("attention.head_count_kv"),
                format!(
                    "{} KV heads do not divide {} heads",
                    self.num_kv_heads, self.num_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Qwen2Error::field(
                &key("attention.head_count"),
                format!(
                    "head dimension {} must be even for rotary embeddings",
                    self.head_dim
                ),
            ));
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps.is_finite()) {
            return Err(Qwen2Error::field(
                &key("attention.layer_norm_rms_epsilon"),
                "must be positive",
            ));
        }
        if !(self.rope_theta > 1.0 && self.rope_theta.is_finite()) {
            return Err(Qwen2Error::field(
                &key("rope.freq_base"),
                "must be greater than 1",
            ));
        }
        Ok(())
    }

    pub fn rotary_pairs(&self) -> RotaryPairs {
        self.architecture.rotary_pairs
    }

    /// Query heads sharing one KV head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

fn meta<'a>(metadata: &'a HashMap<String, Value>, field: &str) -> Result<&'a Value> {
    metadata.get(field).ok_or_else(|| Qwen2Error::MissingField {
        field: field.to_string(),
    })
}

pub(crate) fn meta_str<'a>(metadata: &'a HashMap<String, Value>, field: &str) -> Result<&'a str> {
    specd_text::gguf_metadata::string(meta(metadata, field)?)
        .map_err(|reason| Qwen2Error::field(field, reason))
}

pub(crate) fn meta_usize(metadata: &HashMap<String, Value>, field: &str) -> Result<usize> {
    value_usize(meta(metadata, field)?, field)
}

pub(crate) fn value_usize(value: &Value, field: &str) -> Result<usize> {
    specd_text::gguf_metadata::count(value).map_err(|reason| Qwen2Error::field(field, reason))
}

fn meta_f64(metadata: &HashMap<String, Value>, field: &str) -> Result<f64> {
    specd_text::gguf_metadata::float(meta(metadata, field)?)
        .map_err(|reason| Qwen2Error::field(field, reason))
}

fn meta_f64_or(metadata: &HashMap<String, Value>, field: &str, default: f64) -> Result<f64> {
    if metadata.contains_key(field) {
        meta_f64(metadata, field)
    } else {
        Ok(default)
    }
}

/// `rope_freqs.weight` (`[head_dim / 2]`, Llama 3.1's long-context rotary scaling) where the
/// file has it; empty otherwise.
pub(crate) fn rope_freq_factors(gguf: &crate::gguf::GgufFile, pairs: usize) -> Result<Vec<f64>> {
    const NAME: &str = "rope_freqs.weight";
    if !gguf.has_tensor(NAME) {
        return Ok(Vec::new());
    }
    let raw = gguf.raw(NAME, &[pairs])?;
    let format = crate::cpu::WeightFormat::from_ggml(raw.dtype)
        .filter(|f| f.row_bytes(pairs).is_some())
        .ok_or_else(|| Qwen2Error::field(NAME, format!("stored as {:?}", raw.dtype)))?;
    let mut factors = vec![0f32; pairs];
    crate::cpu::dequantize_row(format, raw.bytes, &mut factors);
    if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
        return Err(Qwen2Error::field(
            NAME,
            format!("factor {bad} is not positive"),
        ));
    }
    Ok(factors.into_iter().map(f64::from).collect())
}
