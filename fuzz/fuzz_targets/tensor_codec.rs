//! `specd.v1.Tensor` from arbitrary bytes: decoding must reject every malformed dtype, shape
//! and byte length with an input error naming the field, never panic, and what it accepts
//! must encode back to the same message.
#![no_main]

use candle_core::Device;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use specd_wire::tensor::{self, Dim, TensorLayout};
use specd_wire::WireTensor;

const FIELD: &str = "draft.carry.hidden";

fuzz_target!(|data: &[u8]| {
    let Ok(wire) = WireTensor::decode(data) else {
        return;
    };
    let decoded = tensor::decode(&wire, FIELD, &Device::Cpu);
    let layout = TensorLayout::parse(FIELD, &wire.dtype, &wire.shape);
    let fits = layout
        .as_ref()
        .is_ok_and(|l| l.check_byte_len(FIELD, wire.data.len()).is_ok());
    assert_eq!(
        decoded.is_ok(),
        fits,
        "decode disagrees with the layout checks"
    );

    let any_shape = vec![Dim::Any; wire.shape.len()];
    let checked = tensor::decode_checked(&wire, FIELD, &Device::Cpu, None, &any_shape);
    assert_eq!(checked.is_ok(), decoded.is_ok());

    match decoded {
        Ok(decoded) => {
            let layout = layout.expect("decode succeeded");
            assert_eq!(decoded.dims(), layout.dims());
            assert_eq!(decoded.dtype(), layout.dtype());
            let again = tensor::encode(&decoded, FIELD).expect("a decoded tensor encodes");
            assert_eq!(again, wire, "decode then encode changed the message");
        }
        Err(error) => {
            assert!(
                error.is_invalid_input(),
                "local failure on bad input: {error}"
            );
            assert!(error.field().starts_with(FIELD), "{error}");
            assert!(!error.to_string().is_empty());
        }
    }
});
