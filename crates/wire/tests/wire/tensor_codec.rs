//! The tensor codec against real candle tensors: round trips for every wire dtype, the exact
//! little-endian bytes, and one test per malformed input.

use bytes::Bytes;
use candle_core::{DType, Device, IndexOp, Tensor};
use half::{bf16, f16};
use specd_wire::tensor::{
    decode, decode_checked, decode_required, encode, Dim, TensorCodecError, TensorLayout,
};
use specd_wire::WireTensor;

const CPU: Device = Device::Cpu;

fn wire(dtype: &str, shape: &[u64], data: Vec<u8>) -> WireTensor {
    WireTensor {
        dtype: dtype.to_owned(),
        shape: shape.to_vec(),
        data: Bytes::from(data),
    }
}

/// Encodes, checks the wire dtype, shape and byte count, decodes, and returns the result.
fn round_trip(t: &Tensor, wire_dtype: &str) -> Tensor {
    let w = encode(t, "t").unwrap();
    assert_eq!(w.dtype, wire_dtype);
    assert_eq!(
        w.shape,
        t.dims().iter().map(|&d| d as u64).collect::<Vec<_>>()
    );
    assert_eq!(w.data.len(), t.elem_count() * t.dtype().size_in_bytes());
    let back = decode(&w, "t", &CPU).unwrap();
    assert_eq!(back.dtype(), t.dtype());
    assert_eq!(back.dims(), t.dims());
    back
}

#[test]
fn f32_round_trips_with_little_endian_bytes() {
    let t = Tensor::new(&[[1.0f32, -2.5], [f32::MAX, f32::MIN_POSITIVE]], &CPU).unwrap();
    let w = encode(&t, "t").unwrap();
    assert_eq!(&w.data[..4], &1.0f32.to_le_bytes());
    assert_eq!(&w.data[..4], &[0x00, 0x00, 0x80, 0x3f]);
    let back = round_trip(&t, "f32");
    assert_eq!(back.to_vec2::<f32>().unwrap(), t.to_vec2::<f32>().unwrap());
}

#[test]
fn f32_special_values_keep_their_bits() {
    let values = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        f32::from_bits(1),
    ];
    let t = Tensor::new(&values, &CPU).unwrap();
    let back = round_trip(&t, "f32").to_vec1::<f32>().unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&back), bits(&values));
}

#[test]
fn bf16_round_trips_bit_patterns() {
    // Normal, negative zero, subnormal, infinities, a NaN payload, largest finite.
    let bits: [u16; 7] = [0x3f80, 0x8000, 0x0001, 0x7f80, 0xff80, 0x7fc1, 0x7f7f];
    let values: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
    let t = Tensor::from_vec(values, (7,), &CPU).unwrap();
    let w = encode(&t, "t").unwrap();
    let expected: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    assert_eq!(&w.data[..], &expected[..]);
    let back = round_trip(&t, "bf16").to_vec1::<bf16>().unwrap();
    assert_eq!(back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), bits);
}

#[test]
fn f16_round_trips_bit_patterns() {
    let bits: [u16; 7] = [0x3c00, 0x8000, 0x0001, 0x7c00, 0xfc00, 0x7e01, 0x7bff];
    let values: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
    let t = Tensor::from_vec(values, (1, 7), &CPU).unwrap();
    let w = encode(&t, "t").unwrap();
    let expected: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    assert_eq!(&w.data[..], &expected[..]);
    let back = round_trip(&t, "f16")
        .flatten_all()
        .unwrap()
        .to_vec1::<f16>()
        .unwrap();
    assert_eq!(back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), bits);
}

#[test]
fn integer_dtypes_round_trip() {
    let u8s = Tensor::new(&[0u8, 1, 127, 255], &CPU).unwrap();
    assert_eq!(
        round_trip(&u8s, "u8").to_vec1::<u8>().unwrap(),
        vec![0, 1, 127, 255]
    );

    let u32s = Tensor::new(&[[0u32, 1], [262_143, u32::MAX]], &CPU).unwrap();
    let w = encode(&u32s, "t").unwrap();
    assert_eq!(&w.data[4..8], &[1, 0, 0, 0]);
    assert_eq!(
        round_trip(&u32s, "u32").to_vec2::<u32>().unwrap(),
        vec![vec![0, 1], vec![262_143, u32::MAX]]
    );

    let i64s = Tensor::new(&[i64::MIN, -1, 0, i64::MAX], &CPU).unwrap();
    let w = encode(&i64s, "t").unwrap();
    assert_eq!(&w.data[8..16], &(-1i64).to_le_bytes());
    assert_eq!(
        round_trip(&i64s, "i64").to_vec1::<i64>().unwrap(),
        vec![i64::MIN, -1, 0, i64::MAX]
    );

    let i32s = Tensor::new(&[i32::MIN, -7, i32::MAX], &CPU).unwrap();
    assert_eq!(
        round_trip(&i32s, "i32").to_vec1::<i32>().unwrap(),
        vec![i32::MIN, -7, i32::MAX]
    );

    let i16s = Tensor::new(&[i16::MIN, -3, i16::MAX], &CPU).unwrap();
    assert_eq!(
        round_trip(&i16s, "i16").to_vec1::<i16>().unwrap(),
        vec![i16::MIN, -3, i16::MAX]
    );
}

#[test]
fn f64_round_trips() {
    let t = Tensor::new(&[std::f64::consts::PI, -1e-300, f64::MAX], &CPU).unwrap();
    assert_eq!(
        round_trip(&t, "f64").to_vec1::<f64>().unwrap(),
        vec![std::f64::consts::PI, -1e-300, f64::MAX]
    );
}

#[test]
fn non_contiguous_tensor_is_sent_in_logical_order() {
    // [2, 3] transposed to [3, 2], and a strided column slice of a [2, 3, 4] tensor.
    let base = Tensor::arange(0f32, 6.0, &CPU)
        .unwrap()
        .reshape((2, 3))
        .unwrap();
    let transposed = base.t().unwrap();
    assert!(!transposed.is_contiguous());
    let back = round_trip(&transposed, "f32");
    assert_eq!(
        back.to_vec2::<f32>().unwrap(),
        vec![vec![0.0, 3.0], vec![1.0, 4.0], vec![2.0, 5.0]]
    );

    let cube = Tensor::arange(0u32, 24, &CPU)
        .unwrap()
        .reshape((2, 3, 4))
        .unwrap();
    let column = cube.i((.., 1..3, 2)).unwrap();
    assert!(!column.is_contiguous());
    let back = round_trip(&column, "u32");
    assert_eq!(
        back.to_vec2::<u32>().unwrap(),
        vec![vec![6, 10], vec![18, 22]]
    );

    let narrowed = cube.to_dtype(DType::BF16).unwrap().narrow(2, 1, 2).unwrap();
    let back = round_trip(&narrowed, "bf16");
    assert_eq!(
        back.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap(),
        narrowed
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    );
}

#[test]
fn scalar_and_empty_tensors_round_trip() {
    let scalar = Tensor::new(7u32, &CPU).unwrap();
    let w = encode(&scalar, "t").unwrap();
    assert!(w.shape.is_empty());
    assert_eq!(&w.data[..], &[7, 0, 0, 0]);
    assert_eq!(round_trip(&scalar, "u32").to_scalar::<u32>().unwrap(), 7);

    let empty = Tensor::zeros((1, 4, 0, 8), DType::BF16, &CPU).unwrap();
    let w = encode(&empty, "t").unwrap();
    assert!(w.data.is_empty());
    assert_eq!(round_trip(&empty, "bf16").dims(), &[1, 4, 0, 8]);
}

#[test]
fn short_data_names_the_field_and_sizes() {
    let w = wire("f32", &[1, 64], vec![0; 255]);
    let err = decode(&w, "draft.carry.hidden", &CPU).unwrap_err();
    assert!(matches!(
        err,
        TensorCodecError::ByteLength {
            expected: 256,
            got: 255,
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        "draft.carry.hidden: expected 256 bytes for f32[1,64], got 255"
    );
    assert_eq!(err.field(), "draft.carry.hidden");
}

#[test]
fn long_data_is_rejected() {
    let w = wire("bf16", &[2, 2], vec![0; 9]);
    let err = decode(&w, "verify.hidden", &CPU).unwrap_err();
    assert_eq!(
        err.to_string(),
        "verify.hidden: expected 8 bytes for bf16[2,2], got 9"
    );
}

#[test]
fn scalar_needs_one_element_and_empty_needs_no_bytes() {
    let err = decode(&wire("i64", &[], vec![]), "s", &CPU).unwrap_err();
    assert_eq!(err.to_string(), "s: expected 8 bytes for i64[], got 0");
    let err = decode(&wire("u8", &[3, 0], vec![1]), "e", &CPU).unwrap_err();
    assert_eq!(err.to_string(), "e: expected 0 bytes for u8[3,0], got 1");
}

#[test]
fn unknown_dtype_is_rejected_by_name() {
    for name in ["", "float32", "F32", "q4_0", "f8e4m3"] {
        let err = decode(&wire(name, &[1], vec![0]), "prefill.hidden", &CPU).unwrap_err();
        assert!(
            matches!(&err, TensorCodecError::UnknownDtype { dtype, .. } if dtype == name),
            "{name}: {err}"
        );
        assert!(
            err.to_string().starts_with(&format!(
                "prefill.hidden.dtype: unknown dtype {name:?}, expected one of u8, u32"
            )),
            "{err}"
        );
    }
}

#[test]
fn shape_product_overflow_is_rejected_before_allocating() {
    let err = decode(&wire("f32", &[u64::MAX, 2], vec![]), "kv.full_k", &CPU).unwrap_err();
    assert!(matches!(err, TensorCodecError::ShapeOverflow { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "kv.full_k.shape: element count of [{},2] overflows",
            u64::MAX
        )
    );

    // The element count fits, the byte count does not.
    let elems = (usize::MAX / 2) as u64;
    let err = decode(&wire("f32", &[elems], vec![]), "x", &CPU).unwrap_err();
    assert!(
        matches!(err, TensorCodecError::ShapeOverflow { .. }),
        "{err}"
    );

    // Each dimension fits, the product does not.
    let err = decode(&wire("u8", &[1 << 32, 1 << 32, 2], vec![]), "y", &CPU).unwrap_err();
    assert!(
        matches!(err, TensorCodecError::ShapeOverflow { .. }),
        "{err}"
    );

    // No elements at all, yet the strides of the other dimensions overflow (found by the
    // tensor_codec fuzz target).
    let err = decode(&wire("u8", &[0, 1 << 32, 1 << 32], vec![]), "z", &CPU).unwrap_err();
    assert!(
        matches!(err, TensorCodecError::ShapeOverflow { .. }),
        "{err}"
    );
    // An empty tensor of modest shape still decodes.
    let empty = decode(&wire("u8", &[0, 4, 4], vec![]), "e", &CPU).unwrap();
    assert_eq!(empty.dims(), &[0, 4, 4]);
}

#[test]
fn missing_tensor_is_named() {
    let err = decode_required(None, "draft.carry.mtp.hidden", &CPU).unwrap_err();
    assert!(matches!(err, TensorCodecError::Missing { .. }));
    assert_eq!(
        err.to_string(),
        "draft.carry.mtp.hidden: required tensor is missing"
    );
    let present = wire("u32", &[1], vec![5, 0, 0, 0]);
    let t = decode_required(Some(&present), "x", &CPU).unwrap();
    assert_eq!(t.to_vec1::<u32>().unwrap(), vec![5]);
}

#[test]
fn expected_dtype_and_shape_are_enforced() {
    let hidden = encode(&Tensor::zeros((1, 1, 64), DType::F32, &CPU).unwrap(), "h").unwrap();
    let want = [Dim::Exactly(1), Dim::Exactly(1), Dim::Exactly(64)];
    let ok = decode_checked(&hidden, "h", &CPU, Some(DType::F32), &want).unwrap();
    assert_eq!(ok.dims(), &[1, 1, 64]);

    let err = decode_checked(&hidden, "draft.hidden", &CPU, Some(DType::BF16), &want).unwrap_err();
    assert_eq!(
        err.to_string(),
        "draft.hidden.dtype: expected bf16, got f32"
    );

    let want = [Dim::Exactly(1), Dim::Any, Dim::Exactly(128)];
    let err = decode_checked(&hidden, "draft.hidden", &CPU, None, &want).unwrap_err();
    assert_eq!(
        err.to_string(),
        "draft.hidden.shape: expected [1,_,128], got [1,1,64]"
    );

    let err = decode_checked(&hidden, "h", &CPU, None, &[Dim::Any, Dim::Any]).unwrap_err();
    assert!(matches!(err, TensorCodecError::ShapeMismatch { .. }));
}

#[test]
fn layout_reports_counts_without_data() {
    let layout = TensorLayout::parse("spec", "bf16", &[1, 8, 100, 256]).unwrap();
    assert_eq!(layout.dtype(), DType::BF16);
    assert_eq!(layout.elem_count(), 8 * 100 * 256);
    assert_eq!(layout.byte_len(), 2 * 8 * 100 * 256);
    assert_eq!(layout.to_string(), "bf16[1,8,100,256]");
}

#[test]
fn errors_become_invalid_argument_statuses() {
    let err = decode(
        &wire("f32", &[1, 64], vec![0; 255]),
        "draft.carry.hidden",
        &CPU,
    )
    .unwrap_err();
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "draft.carry.hidden: expected 256 bytes for f32[1,64], got 255"
    );

    let err = decode(&wire("q8", &[1], vec![0]), "x", &CPU).unwrap_err();
    assert_eq!(err.into_status().code(), tonic::Code::InvalidArgument);
}

#[test]
fn dtypes_the_wire_cannot_carry_are_refused_on_encode() {
    let f8 = Tensor::zeros((2,), DType::F32, &CPU)
        .unwrap()
        .to_dtype(DType::F8E4M3)
        .unwrap();
    let err = encode(&f8, "verify.hidden").unwrap_err();
    assert!(matches!(
        err,
        TensorCodecError::UnsupportedDtype {
            dtype: DType::F8E4M3,
            ..
        }
    ));
    assert!(err
        .to_string()
        .starts_with("verify.hidden: dtype f8e4m3 cannot be sent"));
    // A local failure, not the peer's fault.
    assert_eq!(err.into_status().code(), tonic::Code::Internal);
}
