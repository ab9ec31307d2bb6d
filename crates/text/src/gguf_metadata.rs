//! A GGUF file's metadata (header only: no tensor data is read) and typed access to it.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::{Result, TextError};

pub type Metadata = HashMap<String, Value>;

/// The key/value metadata of the GGUF file at `path`.
pub fn read_metadata(path: &Path) -> Result<Metadata> {
    let file = std::fs::File::open(path).map_err(|e| TextError::io(path, e))?;
    // Buffered: the header holds hundreds of thousands of small strings (the vocabulary and
    // merges), and read straight from the file each one costs system calls.
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let content = Content::read(&mut reader).map_err(|e| TextError::Gguf {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(content.metadata)
}

pub(crate) fn meta_str<'a>(metadata: &'a Metadata, field: &str) -> Result<&'a str> {
    match metadata.get(field) {
        Some(value) => string(value).map_err(|reason| TextError::field(field, reason)),
        None => Err(TextError::MissingField {
            field: field.to_string(),
        }),
    }
}

pub(crate) fn value_usize(value: &Value, field: &str) -> Result<usize> {
    count(value).map_err(|reason| TextError::field(field, reason))
}

/// A non-negative integer of any GGUF integer type, whatever width the writer chose; the
/// caller names the key in its own error.
pub fn count(value: &Value) -> std::result::Result<usize, String> {
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

/// A string; the caller names the key in its own error.
pub fn string(value: &Value) -> std::result::Result<&str, String> {
    match value {
        Value::String(s) => Ok(s),
        other => Err(format!("expected a string, found {:?}", other.value_type())),
    }
}

/// An f32 or f64; the caller names the key in its own error.
pub fn float(value: &Value) -> std::result::Result<f64, String> {
    match value {
        Value::F32(v) => Ok(f64::from(*v)),
        Value::F64(v) => Ok(*v),
        other => Err(format!("expected a float, found {:?}", other.value_type())),
    }
}

pub(crate) fn array<'a>(metadata: &'a Metadata, field: &str) -> Result<&'a [Value]> {
    match metadata.get(field) {
        Some(Value::Array(values)) => Ok(values),
        Some(other) => Err(TextError::field(
            field,
            format!("expected an array, found {:?}", other.value_type()),
        )),
        None => Err(TextError::MissingField {
            field: field.to_string(),
        }),
    }
}

pub(crate) fn string_array<'a>(metadata: &'a Metadata, field: &str) -> Result<Vec<&'a str>> {
    array(metadata, field)?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            string(v).map_err(|reason| TextError::field(&format!("{field}[{i}]"), reason))
        })
        .collect()
}
