//! Model hyper-parameters, read from the `qwen2.*` GGUF metadata.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use super::error::{Qwen2Error, Result};

/// The architecture name this module loads (`general.architecture`).
pub const ARCHITECTURE: &str = "qwen2";

#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2Config {
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
}

impl Qwen2Config {
    /// Reads the config; `vocab_size` comes from the token embedding's row count.
    pub fn from_metadata(metadata: &HashMap<String, Value>, vocab_size: usize) -> Result<Self> {
        let arch = meta_str(metadata, "general.architecture")?;
        if arch != ARCHITECTURE {
            return Err(Qwen2Error::field(
                "general.architecture",
                format!("expected {ARCHITECTURE:?}, found {arch:?}"),
            ));
        }
        let key = |name: &str| format!("{ARCHITECTURE}.{name}");
        let hidden_size = meta_usize(metadata, &key("embedding_length"))?;
        let num_heads = meta_usize(metadata, &key("attention.head_count"))?;
        let num_kv_heads = meta_usize(metadata, &key("attention.head_count_kv"))?;
        let config = Self {
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
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        let key = |name: &str| format!("{ARCHITECTURE}.{name}");
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
    match meta(metadata, field)? {
        Value::String(s) => Ok(s),
        other => Err(Qwen2Error::field(
            field,
            format!("expected a string, found {:?}", other.value_type()),
        )),
    }
}

pub(crate) fn meta_usize(metadata: &HashMap<String, Value>, field: &str) -> Result<usize> {
    value_usize(meta(metadata, field)?, field)
}

pub(crate) fn value_usize(value: &Value, field: &str) -> Result<usize> {
    crate::gguf_value::count(value).map_err(|reason| Qwen2Error::field(field, reason))
}

fn meta_f64(metadata: &HashMap<String, Value>, field: &str) -> Result<f64> {
    crate::gguf_value::float(meta(metadata, field)?)
        .map_err(|reason| Qwen2Error::field(field, reason))
}

fn meta_f64_or(metadata: &HashMap<String, Value>, field: &str, default: f64) -> Result<f64> {
    if metadata.contains_key(field) {
        meta_f64(metadata, field)
    } else {
        Ok(default)
    }
}
