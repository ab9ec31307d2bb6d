//! Typed reads of GGUF metadata.

use super::*;

/// Typed reads of GGUF metadata; errors name the key.
pub(super) struct Meta<'a>(pub(super) &'a HashMap<String, Value>);

impl Meta<'_> {
    pub(super) fn required(&self, key: &str) -> Result<&Value> {
        self.0
            .get(key)
            .ok_or_else(|| ModelError::config(key, "missing from the GGUF metadata"))
    }

    pub(super) fn string(&self, key: &str) -> Result<&str> {
        specd_text::gguf_metadata::string(self.required(key)?)
            .map_err(|reason| ModelError::config(key, reason))
    }

    pub(super) fn usize(&self, key: &str) -> Result<usize> {
        integer(self.required(key)?, key)
    }

    pub(super) fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        self.0.get(key).map(|v| integer(v, key)).transpose()
    }

    pub(super) fn f64(&self, key: &str) -> Result<f64> {
        float(self.required(key)?, key)
    }

    pub(super) fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        self.0.get(key).map(|v| float(v, key)).transpose()
    }

    pub(super) fn bools(&self, key: &str) -> Result<Vec<bool>> {
        let wrong =
            |found: String| ModelError::config(key, format!("expected booleans, found {found}"));
        match self.required(key)? {
            Value::Array(items) => items
                .iter()
                .map(|item| match item {
                    Value::Bool(b) => Ok(*b),
                    other => Err(wrong(format!("{:?}", other.value_type()))),
                })
                .collect(),
            other => Err(wrong(format!("{:?}", other.value_type()))),
        }
    }

    /// A per-layer count, written as one value or as an array of one value per layer.
    pub(super) fn per_layer(&self, key: &str, layers: usize) -> Result<Vec<usize>> {
        match self.required(key)? {
            Value::Array(items) => {
                if items.len() != layers {
                    return Err(ModelError::config(
                        key,
                        format!("has {} entries for {layers} layers", items.len()),
                    ));
                }
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| integer(v, &format!("{key}[{i}]")))
                    .collect()
            }
            one => Ok(vec![integer(one, key)?; layers]),
        }
    }

    /// A per-layer count that this model needs to be the same on every layer.
    pub(super) fn uniform(&self, key: &str, layers: usize) -> Result<usize> {
        let values = self.per_layer(key, layers)?;
        let first = values.first().copied().unwrap_or(0);
        if values.iter().any(|&v| v != first) {
            return Err(ModelError::Unsupported(format!(
                "GGUF metadata {key}: differs between layers ({values:?})"
            )));
        }
        Ok(first)
    }
}

pub(super) fn integer(value: &Value, key: &str) -> Result<usize> {
    specd_text::gguf_metadata::count(value).map_err(|reason| ModelError::config(key, reason))
}

pub(super) fn float(value: &Value, key: &str) -> Result<f64> {
    specd_text::gguf_metadata::float(value).map_err(|reason| ModelError::config(key, reason))
}
