//! `specd.v1.Tensor` <-> `candle_core::Tensor`.
//!
//! The wire form is dtype name, shape and densely packed little-endian bytes. Decoding checks
//! everything a sender could get wrong (dtype name, shape overflow, byte length) before any
//! memory is allocated on a device, and every error names the field path it concerns.

mod codec;
mod dtype;
mod error;
mod layout;

pub use codec::{decode, decode_checked, decode_required, encode, encode_le_bytes, from_le_bytes};
pub use dtype::{parse_wire_dtype, wire_dtype_name, SUPPORTED_DTYPES};
pub use error::TensorCodecError;
pub use layout::{Dim, TensorLayout};
