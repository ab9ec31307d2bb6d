//! Validated dtype and shape of a tensor on the wire.

use candle_core::DType;

use super::dtype::parse_wire_dtype;
use super::error::{fmt_dims, TensorCodecError};

/// A dtype and shape that passed validation: the dtype is one the wire carries, and the
/// element and byte counts fit in `usize`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLayout {
    dtype: DType,
    dims: Vec<usize>,
    elem_count: usize,
    byte_len: usize,
}

/// One entry of an expected shape: a fixed size, or any size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    Exactly(usize),
    Any,
}

impl TensorLayout {
    /// Validates a wire dtype name and shape; `field` is the path of the tensor (or spec)
    /// message, used in errors.
    pub fn parse(field: &str, dtype: &str, shape: &[u64]) -> Result<Self, TensorCodecError> {
        let dtype = parse_wire_dtype(dtype).ok_or_else(|| TensorCodecError::UnknownDtype {
            field: field.to_owned(),
            dtype: dtype.to_owned(),
        })?;
        let overflow = || TensorCodecError::ShapeOverflow {
            field: field.to_owned(),
            shape: shape.to_vec(),
        };
        let mut dims = Vec::with_capacity(shape.len());
        let mut elem_count: usize = 1;
        // The product of the non-zero dimensions bounds every stride of the shape: a zero
        // dimension empties the tensor but does not stop its strides from overflowing.
        let mut strides_bound: usize = 1;
        for &dim in shape {
            let dim = usize::try_from(dim).map_err(|_| overflow())?;
            elem_count = elem_count.checked_mul(dim).ok_or_else(overflow)?;
            strides_bound = strides_bound.checked_mul(dim.max(1)).ok_or_else(overflow)?;
            dims.push(dim);
        }
        let byte_len = elem_count
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(overflow)?;
        Ok(Self {
            dtype,
            dims,
            elem_count,
            byte_len,
        })
    }

    /// The layout of an existing candle tensor whose dtype the wire carries.
    pub(crate) fn of_dims(dtype: DType, dims: &[usize]) -> Self {
        let elem_count = dims.iter().product();
        Self {
            dtype,
            dims: dims.to_vec(),
            elem_count,
            byte_len: elem_count * dtype.size_in_bytes(),
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The shape as the wire spells it.
    pub fn wire_shape(&self) -> Vec<u64> {
        self.dims.iter().map(|&d| d as u64).collect()
    }

    pub fn elem_count(&self) -> usize {
        self.elem_count
    }

    /// Bytes of the packed little-endian data.
    pub fn byte_len(&self) -> usize {
        self.byte_len
    }

    /// Checks that `data_len` bytes hold exactly this layout.
    pub fn check_byte_len(&self, field: &str, data_len: usize) -> Result<(), TensorCodecError> {
        if data_len == self.byte_len {
            return Ok(());
        }
        Err(TensorCodecError::ByteLength {
            field: field.to_owned(),
            dtype: self.dtype,
            shape: self.wire_shape(),
            expected: self.byte_len,
            got: data_len,
        })
    }

    /// Checks the layout against what the receiver needs: a dtype (if given) and a shape
    /// pattern of the same rank.
    pub fn expect(
        &self,
        field: &str,
        dtype: Option<DType>,
        dims: &[Dim],
    ) -> Result<(), TensorCodecError> {
        if let Some(expected) = dtype {
            if expected != self.dtype {
                return Err(TensorCodecError::DtypeMismatch {
                    field: field.to_owned(),
                    expected,
                    got: self.dtype,
                });
            }
        }
        let matches = dims.len() == self.dims.len()
            && dims.iter().zip(&self.dims).all(|(want, &got)| match want {
                Dim::Exactly(n) => *n == got,
                Dim::Any => true,
            });
        if matches {
            return Ok(());
        }
        Err(TensorCodecError::ShapeMismatch {
            field: field.to_owned(),
            expected: fmt_pattern(dims),
            got: self.dims.clone(),
        })
    }
}

impl std::fmt::Display for TensorLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.dtype.as_str(), fmt_dims(&self.dims))
    }
}

fn fmt_pattern(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Dim::Exactly(n) => n.to_string(),
            Dim::Any => "_".to_owned(),
        })
        .collect();
    format!("[{}]", parts.join(","))
}
