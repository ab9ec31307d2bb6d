//! The element types the wire carries and their little-endian byte forms.

use candle_core::{DType, WithDType};
use half::{bf16, f16};

/// Wire names of the supported element types, as candle spells them.
pub const SUPPORTED_DTYPES: [&str; 9] = [
    "u8", "u32", "i16", "i32", "i64", "bf16", "f16", "f32", "f64",
];

/// The candle dtype a wire name stands for, or `None` for names the wire does not accept.
pub fn parse_wire_dtype(name: &str) -> Option<DType> {
    let dtype = match name {
        "u8" => DType::U8,
        "u32" => DType::U32,
        "i16" => DType::I16,
        "i32" => DType::I32,
        "i64" => DType::I64,
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        "f32" => DType::F32,
        "f64" => DType::F64,
        _ => return None,
    };
    Some(dtype)
}

/// The wire name of a candle dtype, or `None` when the wire cannot carry it (sub-byte and
/// 8-bit float formats).
pub fn wire_dtype_name(dtype: DType) -> Option<&'static str> {
    let name = dtype.as_str();
    SUPPORTED_DTYPES.contains(&name).then_some(name)
}

/// An element type with a fixed-size little-endian encoding.
pub(crate) trait LeElement: WithDType {
    const SIZE: usize;
    /// Reads one element from exactly `SIZE` bytes.
    fn read_le(bytes: &[u8]) -> Self;
    fn write_le(self, out: &mut Vec<u8>);
}

macro_rules! le_element {
    ($($ty:ty),*) => {$(
        impl LeElement for $ty {
            const SIZE: usize = std::mem::size_of::<$ty>();
            fn read_le(bytes: &[u8]) -> Self {
                let mut raw = [0u8; std::mem::size_of::<$ty>()];
                raw.copy_from_slice(bytes);
                <$ty>::from_le_bytes(raw)
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}

le_element!(u8, u32, i16, i32, i64, bf16, f16, f32, f64);
