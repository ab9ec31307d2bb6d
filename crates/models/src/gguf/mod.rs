//! GGUF files, whichever family they hold: the open file with its tensors (copied into
//! candle tensors or borrowed from the read-only map); their metadata values are read by
//! `specd_text::gguf_metadata`, the one reader for tokenizers and models alike.

mod error;
mod file;

pub use error::GgufError;
pub use file::{GgufFile, RawTensor};
