//! Gemma 4 text model (the verifier's target) in candle.

pub mod cache;
pub mod config;
mod family;
pub mod gguf;
mod layer;
pub(crate) mod layer_frame;
mod model;
mod moe;
pub(crate) mod norm;
pub(crate) mod raw_config;
pub(crate) mod rope;

pub use crate::causal_lm::OutputRows;
pub use crate::shared_kv::{LayerKv, SharedKv};
pub use cache::SequenceCache;
pub use config::{
    CheckpointLayout, Gemma4TextConfig, LayerGeometry, LayerKind, MoeConfig, RopeConfig,
};
pub use family::FAMILY;
pub use model::{BlockInput, Gemma4Model, DEFAULT_PREFILL_CHUNK};
