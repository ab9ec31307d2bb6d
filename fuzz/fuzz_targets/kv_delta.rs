//! `specd.v1.KvDelta` from arbitrary bytes: the decoder must reject inconsistent K/V
//! tensors with an input error, never panic, and what it accepts must encode back to the
//! same message.
#![no_main]

use candle_core::Device;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use specd_wire::kv::{KvDeltaTensors, KvWireError};
use specd_wire::KvDelta;

const FIELD: &str = "draft.kv_delta";

fuzz_target!(|data: &[u8]| {
    let Ok(wire) = KvDelta::decode(data) else {
        return;
    };
    match KvDeltaTensors::decode(&wire, FIELD, &Device::Cpu) {
        Ok(delta) => {
            assert!(delta.rows() >= 1, "a delta carries at least one row");
            let again = delta.encode(FIELD).expect("a decoded delta encodes");
            assert_eq!(again, wire, "decode then encode changed the message");
        }
        Err(error) => {
            if let KvWireError::Tensor(tensor_error) = &error {
                assert!(
                    tensor_error.is_invalid_input(),
                    "local failure on bad input: {error}"
                );
            }
            assert!(error.to_string().contains(FIELD), "{error}");
        }
    }
});
