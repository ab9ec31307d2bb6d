//! GGUF files, whichever family they hold: the open file with its tensors (copied into
//! candle tensors or borrowed from the read-only map) and its metadata values.

mod error;
mod file;
pub(crate) mod value;

pub use error::GgufError;
pub use file::{GgufFile, RawTensor};
