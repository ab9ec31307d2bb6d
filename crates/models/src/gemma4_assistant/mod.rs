//! The Gemma 4 assistant: the multi-token-prediction drafter (`model_type: gemma4_assistant`,
//! transformers' `Gemma4AssistantForCausalLM`) that drafts from the target's last hidden state
//! and the target's shared K/V.
//!
//! A draft block of K tokens runs K steps. Each step embeds the previous token with the
//! target's embedding table, concatenates the previous hidden state, projects down to the
//! assistant's width, runs its layers with the query at the last committed position against
//! the target's K/V (full layers: every committed position; sliding layers: the last W + 1),
//! and projects back up to the target's hidden size for the next step.

mod config;
mod embedding;
mod family;
mod head;
mod layer;
mod mirror;
mod model;

pub use config::Gemma4AssistantConfig;
pub use embedding::TargetEmbedding;
pub use family::FAMILY;
pub use head::{first_argmax, CentroidSelection};
pub use mirror::SharedKvMirror;
pub use model::{BlockSteps, DraftStep, Gemma4Assistant};
