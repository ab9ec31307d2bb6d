//! GGUF metadata values read as counts and floats, whatever width the writer chose; the
//! callers name the key in their own error type.

use candle_core::quantized::gguf_file::Value;

/// A non-negative integer of any GGUF integer type.
pub(crate) fn count(value: &Value) -> Result<usize, String> {
    let wide: i128 = match value {
        Value::U8(v) => (*v).into(),
        Value::I8(v) => (*v).into(),
        Value::U16(v) => (*v).into(),
        Value::I16(v) => (*v).into(),
        Value::U32(v) => (*v).into(),
        Value::I32(v) => (*v).into(),
        Value::U64(v) => (*v).into(),
        Value::I64(v) => (*v).into(),
        other => {
            return Err(format!(
                "expected an integer, found {:?}",
                other.value_type()
            ))
        }
    };
    usize::try_from(wide).map_err(|_| format!("{wide} is not a valid count or id"))
}

/// An f32 or f64.
pub(crate) fn float(value: &Value) -> Result<f64, String> {
    match value {
        Value::F32(v) => Ok(f64::from(*v)),
        Value::F64(v) => Ok(*v),
        other => Err(format!("expected a float, found {:?}", other.value_type())),
    }
}
