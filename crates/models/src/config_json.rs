//! Reading a Hugging Face `config.json` into derived structs whose errors name the failing field
//! by its path in the file (`text_config.num_hidden_layers: invalid type: ...`).

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ModelError;

/// Reads `config.json` from a checkpoint directory. It is parsed to a `Value` first so that a
/// repeated key keeps its last value rather than failing a derived struct.
pub(crate) fn read(dir: &Path) -> Result<Value, ModelError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| ModelError::config("config.json", format!("{}: {e}", path.display())))
}

/// Deserializes the object found at `prefix` ("" for the root, else e.g. `"text_config."`).
pub(crate) fn parse<T: DeserializeOwned>(value: &Value, prefix: &str) -> Result<T, ModelError> {
    // A derived struct would also take an array of its fields in order; configs are objects.
    if !value.is_object() {
        let name = prefix.strip_suffix('.').unwrap_or("config.json");
        return Err(ModelError::config(name, "expected an object"));
    }
    serde_path_to_error::deserialize(value)
        .map_err(|e| ModelError::config(&format!("{prefix}{}", e.path()), e.inner().to_string()))
}

/// A field the config must set: absent and null are both missing.
pub(crate) fn required<T>(value: Option<T>, field: &str) -> Result<T, ModelError> {
    value.ok_or_else(|| ModelError::config(field, "missing"))
}

/// The root's `model_type`, which tells the loaders apart.
pub(crate) fn model_type(root: &Value) -> Result<Option<String>, ModelError> {
    #[derive(Deserialize)]
    struct Head {
        model_type: Option<String>,
    }
    Ok(parse::<Head>(root, "")?.model_type)
}

/// Deserializes a field that was kept as written until it is known to be read.
pub(crate) fn deferred<T: DeserializeOwned>(
    value: Option<&Value>,
    field: &str,
) -> Result<Option<T>, ModelError> {
    value
        .map(|v| T::deserialize(v).map_err(|e| ModelError::config(field, e.to_string())))
        .transpose()
}
