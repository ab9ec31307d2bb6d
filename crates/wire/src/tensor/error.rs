//! Errors of the tensor codec. Every variant names the field path it concerns, so a
//! malformed request is answered with a message that says exactly what was wrong.

use candle_core::DType;

use super::dtype::SUPPORTED_DTYPES;

/// What went wrong while turning a wire tensor into a candle tensor or back.
#[derive(Debug, thiserror::Error)]
pub enum TensorCodecError {
    /// A tensor field the message requires was not set.
    #[error("{field}: required tensor is missing")]
    Missing { field: String },

    /// `dtype` is not one of the names the wire accepts.
    #[error("{field}.dtype: unknown dtype {dtype:?}, expected one of {}", SUPPORTED_DTYPES.join(", "))]
    UnknownDtype { field: String, dtype: String },

    /// The product of `shape` (or that product times the element size) does not fit in
    /// the address space.
    #[error("{field}.shape: element count of {} overflows", fmt_shape(shape))]
    ShapeOverflow { field: String, shape: Vec<u64> },

    /// `data` does not hold exactly `product(shape) * size_of(dtype)` bytes.
    #[error("{field}: expected {expected} bytes for {}{}, got {got}", dtype.as_str(), fmt_shape(shape))]
    ByteLength {
        field: String,
        dtype: DType,
        shape: Vec<u64>,
        expected: usize,
        got: usize,
    },

    /// The tensor is well formed but of another dtype than the receiver needs.
    #[error("{field}.dtype: expected {}, got {}", expected.as_str(), got.as_str())]
    DtypeMismatch {
        field: String,
        expected: DType,
        got: DType,
    },

    /// The tensor is well formed but of another shape than the receiver needs.
    #[error("{field}.shape: expected {expected}, got {}", fmt_dims(got))]
    ShapeMismatch {
        field: String,
        /// The expected pattern, `_` standing for any size.
        expected: String,
        got: Vec<usize>,
    },

    /// A candle tensor of a dtype the wire cannot carry was handed to the encoder.
    #[error("{field}: dtype {} cannot be sent, expected one of {}", dtype.as_str(), SUPPORTED_DTYPES.join(", "))]
    UnsupportedDtype { field: String, dtype: DType },

    /// candle failed while copying data to or from a device.
    #[error("{field}: {source}")]
    Candle {
        field: String,
        #[source]
        source: candle_core::Error,
    },
}

impl TensorCodecError {
    /// The field path the error concerns, for example `draft.carry.hidden`.
    pub fn field(&self) -> &str {
        match self {
            Self::Missing { field }
            | Self::UnknownDtype { field, .. }
            | Self::ShapeOverflow { field, .. }
            | Self::ByteLength { field, .. }
            | Self::DtypeMismatch { field, .. }
            | Self::ShapeMismatch { field, .. }
            | Self::UnsupportedDtype { field, .. }
            | Self::Candle { field, .. } => field,
        }
    }

    /// True when the error is the sender's fault (malformed or unexpected input), false when
    /// it is a local failure (an encoder handed an unsupported tensor, or a device error).
    pub fn is_invalid_input(&self) -> bool {
        !matches!(self, Self::UnsupportedDtype { .. } | Self::Candle { .. })
    }

    /// The gRPC status to answer with: INVALID_ARGUMENT for bad input, INTERNAL otherwise.
    pub fn into_status(self) -> tonic::Status {
        if self.is_invalid_input() {
            tonic::Status::invalid_argument(self.to_string())
        } else {
            tonic::Status::internal(self.to_string())
        }
    }
}

impl From<TensorCodecError> for tonic::Status {
    fn from(err: TensorCodecError) -> Self {
        err.into_status()
    }
}

/// `[1,64]`: the compact form used in messages.
fn fmt_shape(shape: &[u64]) -> String {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!("[{}]", dims.join(","))
}

pub(super) fn fmt_dims(dims: &[usize]) -> String {
    let dims: Vec<String> = dims.iter().map(usize::to_string).collect();
    format!("[{}]", dims.join(","))
}
