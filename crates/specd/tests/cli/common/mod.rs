//! What the CLI tests share: the Gemma 4 fixtures and their HF reference files.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/gemma4")
        .join(name)
}

/// The llama.cpp conversion (F32) of the fixture `name` (tools/gemma4_gguf_fixtures.sh).
pub fn gguf_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/gemma4-gguf")
        .join(format!("{name}-f32.gguf"))
}

pub fn reference(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join("reference.json")).unwrap())
        .unwrap()
}

pub fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

pub fn join(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// The JSON a successful `specd ... --json` run printed; a failed run fails the test with its
/// stderr.
pub fn json_of(out: Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
