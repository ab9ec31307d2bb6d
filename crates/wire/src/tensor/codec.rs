//! Encoding and decoding of tensors as packed little-endian bytes.

use bytes::Bytes;
use candle_core::{DType, Device, Tensor};

use super::dtype::{wire_dtype_name, LeElement};
use super::error::TensorCodecError;
use super::layout::{Dim, TensorLayout};
use crate::WireTensor;

/// Encodes a candle tensor (any device, any strides) for the wire. `field` names the
/// message field in errors.
pub fn encode(tensor: &Tensor, field: &str) -> Result<WireTensor, TensorCodecError> {
    let (layout, data) = encode_le_bytes(tensor, field)?;
    Ok(WireTensor {
        dtype: layout.dtype().as_str().to_owned(),
        shape: layout.wire_shape(),
        data: Bytes::from(data),
    })
}

/// The tensor's elements in row-major order as little-endian bytes, with its layout. Copies
/// device tensors to the host; non-contiguous tensors are gathered first.
pub fn encode_le_bytes(
    tensor: &Tensor,
    field: &str,
) -> Result<(TensorLayout, Vec<u8>), TensorCodecError> {
    let dtype = tensor.dtype();
    if wire_dtype_name(dtype).is_none() {
        return Err(TensorCodecError::UnsupportedDtype {
            field: field.to_owned(),
            dtype,
        });
    }
    let candle_err = |source| TensorCodecError::Candle {
        field: field.to_owned(),
        source,
    };
    let flat = tensor.flatten_all().map_err(candle_err)?;
    let data = match dtype {
        DType::U8 => le_bytes::<u8>(&flat),
        DType::U32 => le_bytes::<u32>(&flat),
        DType::I16 => le_bytes::<i16>(&flat),
        DType::I32 => le_bytes::<i32>(&flat),
        DType::I64 => le_bytes::<i64>(&flat),
        DType::BF16 => le_bytes::<half::bf16>(&flat),
        DType::F16 => le_bytes::<half::f16>(&flat),
        DType::F32 => le_bytes::<f32>(&flat),
        DType::F64 => le_bytes::<f64>(&flat),
        _ => {
            return Err(TensorCodecError::UnsupportedDtype {
                field: field.to_owned(),
                dtype,
            })
        }
    }
    .map_err(candle_err)?;
    Ok((TensorLayout::of_dims(dtype, tensor.dims()), data))
}

/// Validates and decodes a wire tensor onto `device`.
pub fn decode(wire: &WireTensor, field: &str, device: &Device) -> Result<Tensor, TensorCodecError> {
    let layout = TensorLayout::parse(field, &wire.dtype, &wire.shape)?;
    from_le_bytes(&layout, &wire.data, field, device)
}

/// Like [`decode`] for an optional message field: an unset field is
/// [`TensorCodecError::Missing`].
pub fn decode_required(
    wire: Option<&WireTensor>,
    field: &str,
    device: &Device,
) -> Result<Tensor, TensorCodecError> {
    let wire = wire.ok_or_else(|| TensorCodecError::Missing {
        field: field.to_owned(),
    })?;
    decode(wire, field, device)
}

/// Like [`decode`], after checking the tensor against the dtype (if given) and shape pattern
/// the receiver needs, so that a wrong tensor is rejected before it is copied to the device.
pub fn decode_checked(
    wire: &WireTensor,
    field: &str,
    device: &Device,
    dtype: Option<DType>,
    dims: &[Dim],
) -> Result<Tensor, TensorCodecError> {
    let layout = TensorLayout::parse(field, &wire.dtype, &wire.shape)?;
    layout.expect(field, dtype, dims)?;
    from_le_bytes(&layout, &wire.data, field, device)
}

/// Builds a tensor of `layout` from packed little-endian bytes, checking their length first.
pub fn from_le_bytes(
    layout: &TensorLayout,
    data: &[u8],
    field: &str,
    device: &Device,
) -> Result<Tensor, TensorCodecError> {
    layout.check_byte_len(field, data.len())?;
    let dims = layout.dims();
    let tensor = match layout.dtype() {
        DType::U8 => tensor_from::<u8>(data, dims, device),
        DType::U32 => tensor_from::<u32>(data, dims, device),
        DType::I16 => tensor_from::<i16>(data, dims, device),
        DType::I32 => tensor_from::<i32>(data, dims, device),
        DType::I64 => tensor_from::<i64>(data, dims, device),
        DType::BF16 => tensor_from::<half::bf16>(data, dims, device),
        DType::F16 => tensor_from::<half::f16>(data, dims, device),
        DType::F32 => tensor_from::<f32>(data, dims, device),
        DType::F64 => tensor_from::<f64>(data, dims, device),
        // TensorLayout::parse only admits the dtypes above.
        other => {
            return Err(TensorCodecError::UnsupportedDtype {
                field: field.to_owned(),
                dtype: other,
            })
        }
    };
    tensor.map_err(|source| TensorCodecError::Candle {
        field: field.to_owned(),
        source,
    })
}

fn le_bytes<T: LeElement>(flat: &Tensor) -> candle_core::Result<Vec<u8>> {
    let values = flat.to_vec1::<T>()?;
    let mut out = Vec::with_capacity(values.len() * T::SIZE);
    for value in values {
        value.write_le(&mut out);
    }
    Ok(out)
}

fn tensor_from<T: LeElement>(
    data: &[u8],
    dims: &[usize],
    device: &Device,
) -> candle_core::Result<Tensor> {
    let values: Vec<T> = data.chunks_exact(T::SIZE).map(T::read_le).collect();
    Tensor::from_vec(values, dims, device)
}
