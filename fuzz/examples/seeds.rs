//! Writes the committed seed corpus: `cargo run --example seeds` from `fuzz/` rewrites
//! `corpus/<target>/` with a handful of small valid (and a few near-valid) inputs per
//! target, built from real values with the project's own encoders.

use std::path::Path;

use bytes::Bytes;
use candle_core::{DType, Device, Tensor};
use prost::Message;
use specd_fuzz::chunk_stream;
use specd_fuzz::stop_case::{StopCase, CANCEL_AT_END, IGNORE_EOS, STRIP_LEADING_SPACE};
use specd_wire::generation::{
    generate_request, output_constraint, ChatMessage, ChatMessages, GenerateRequest,
    OutputConstraint, SamplingParams, SpeculativeParams, TokenIds,
};
use specd_wire::kv::{snapshot_chunks, KvDeltaTensors, KvPair, KvSnapshot};
use specd_wire::{tensor, WireTensor};

type Seeds = Vec<(&'static str, Vec<u8>)>;

fn main() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let targets: [(&str, Seeds); 5] = [
        ("tensor_codec", tensor_codec()),
        ("kv_delta", kv_delta()),
        ("snapshot_assembler", snapshot_assembler()),
        ("generate_request", generate_request()),
        ("stop_checker", stop_checker()),
    ];
    for (target, seeds) in targets {
        let dir = corpus.join(target);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("corpus dir");
        for (name, bytes) in seeds {
            std::fs::write(dir.join(name), bytes).expect("seed file");
        }
    }
}

/// A small tensor with distinct values, so that byte order mistakes show.
fn ramp(dims: &[usize], dtype: DType) -> Tensor {
    let n: usize = dims.iter().product();
    let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 1.0).collect();
    Tensor::from_vec(values, dims, &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .expect("seed tensor")
}

fn wire(dims: &[usize], dtype: DType) -> WireTensor {
    tensor::encode(&ramp(dims, dtype), "seed").expect("seed tensor encodes")
}

fn tensor_codec() -> Seeds {
    let mut short = wire(&[2, 2], DType::F32);
    short.data = short.data.slice(..12);
    vec![
        ("f32_2x3", wire(&[2, 3], DType::F32).encode_to_vec()),
        ("bf16_1x2x2", wire(&[1, 2, 2], DType::BF16).encode_to_vec()),
        ("u8_4", wire(&[4], DType::U8).encode_to_vec()),
        ("i64_scalar", wire(&[], DType::I64).encode_to_vec()),
        ("f16_empty_0x3", wire(&[0, 3], DType::F16).encode_to_vec()),
        ("f32_short_data", short.encode_to_vec()),
        (
            "unknown_dtype",
            WireTensor {
                dtype: "q4_0".to_owned(),
                shape: vec![2],
                data: Bytes::from_static(&[0, 0]),
            }
            .encode_to_vec(),
        ),
    ]
}

fn pair(dims: &[usize], dtype: DType) -> KvPair {
    KvPair {
        k: ramp(dims, dtype),
        v: ramp(dims, dtype).affine(2.0, 1.0).expect("affine"),
    }
}

fn kv_delta() -> Seeds {
    let full_only = KvDeltaTensors {
        start_position: 5,
        full: pair(&[1, 2, 1, 4], DType::F32),
        sliding: None,
        sliding_evicted: 0,
    };
    let with_sliding = KvDeltaTensors {
        start_position: 9,
        full: pair(&[1, 1, 2, 2], DType::BF16),
        sliding: Some(pair(&[1, 2, 2, 2], DType::BF16)),
        sliding_evicted: 1,
    };
    let mut no_rows = full_only.encode("seed").expect("delta encodes");
    for t in [&mut no_rows.full_k, &mut no_rows.full_v] {
        let t = t.as_mut().expect("full tensors");
        t.shape = vec![1, 2, 0, 4];
        t.data = Bytes::new();
    }
    let encode = |d: &KvDeltaTensors| d.encode("seed").expect("delta encodes").encode_to_vec();
    vec![
        ("full_only", encode(&full_only)),
        ("with_sliding", encode(&with_sliding)),
        ("zero_rows", no_rows.encode_to_vec()),
    ]
}

fn snapshot_assembler() -> Seeds {
    let full_only = KvSnapshot {
        committed_len: 3,
        sliding_start: 0,
        full: pair(&[1, 1, 3, 2], DType::F16),
        sliding: None,
    };
    let with_sliding = KvSnapshot {
        committed_len: 4,
        sliding_start: 2,
        full: pair(&[1, 2, 4, 2], DType::F32),
        sliding: Some(pair(&[1, 1, 2, 2], DType::F32)),
    };
    let chunks = |s: &KvSnapshot, size: usize| snapshot_chunks(s, size).expect("snapshot chunks");
    let mut truncated = chunks(&with_sliding, 16);
    truncated.pop();
    let mut reordered = chunks(&full_only, 4);
    reordered.swap(1, 2);
    vec![
        ("full_only", chunk_stream::encode(0, &chunks(&full_only, 5))),
        (
            "with_sliding",
            chunk_stream::encode(0, &chunks(&with_sliding, 16)),
        ),
        (
            "over_limit",
            chunk_stream::encode(3, &chunks(&full_only, 64)),
        ),
        ("truncated", chunk_stream::encode(1, &truncated)),
        ("reordered", chunk_stream::encode(0, &reordered)),
    ]
}

fn generate_request() -> Seeds {
    let base = GenerateRequest {
        input: Some(generate_request::Input::PromptIds(TokenIds {
            ids: vec![3, 4, 5],
        })),
        max_tokens: Some(8),
        ..GenerateRequest::default()
    };
    let text = GenerateRequest {
        input: Some(generate_request::Input::Prompt("w3 w4 hello w5".to_owned())),
        max_tokens: None,
        stop: vec!["w9".to_owned(), "\n\n".to_owned()],
        sampling: Some(SamplingParams {
            temperature: Some(0.7),
            top_p: Some(0.9),
            top_k: Some(5),
            seed: Some(42),
            ..Default::default()
        }),
        ..base.clone()
    };
    let chat = GenerateRequest {
        input: Some(generate_request::Input::Messages(ChatMessages {
            messages: vec![
                ChatMessage {
                    role: "system".to_owned(),
                    content: "w1 w2".to_owned(),
                    ..Default::default()
                },
                ChatMessage {
                    role: "user".to_owned(),
                    content: "w7 w8 w9".to_owned(),
                    ..Default::default()
                },
            ],
            template_variables_json: String::new(),
        })),
        speculative: Some(SpeculativeParams {
            disabled: false,
            block_size: Some(4),
            ..Default::default()
        }),
        ..base.clone()
    };
    let shaped = GenerateRequest {
        sampling: Some(SamplingParams {
            temperature: Some(0.8),
            presence_penalty: Some(0.5),
            frequency_penalty: Some(-0.25),
            repetition_penalty: Some(1.2),
            min_p: Some(0.05),
            logit_bias: [(3, 4.0), (5, -100.0)].into_iter().collect(),
            ..Default::default()
        }),
        top_logprobs: Some(3),
        constraint: Some(OutputConstraint {
            kind: Some(output_constraint::Kind::Regex("w[0-9]+( w[0-9]+)*".to_owned())),
        }),
        ..base.clone()
    };
    let refused = GenerateRequest {
        max_tokens: Some(0),
        ignore_eos: true,
        speculative: Some(SpeculativeParams {
            disabled: true,
            block_size: Some(0),
            ..Default::default()
        }),
        ..base.clone()
    };
    vec![
        ("prompt_ids", base.encode_to_vec()),
        ("text_sampled", text.encode_to_vec()),
        ("chat_block_4", chat.encode_to_vec()),
        ("shaped_constrained", shaped.encode_to_vec()),
        ("refused_max_tokens", refused.encode_to_vec()),
    ]
}

fn stop_checker() -> Seeds {
    let e_acute = "é".as_bytes();
    let pieces: Vec<Vec<u8>> = [
        b"<eos>".as_slice(),
        b"<stop>",
        b"Hello",
        b" wor",
        b"ld",
        b"!",
        &e_acute[..1],
        &e_acute[1..],
        "é".as_bytes(),
        b" ",
    ]
    .iter()
    .map(|p| p.to_vec())
    .collect();
    let base = StopCase {
        flags: 0,
        max_tokens: 16,
        pieces,
        stop_strings: vec!["world".to_owned()],
        eos_ids: vec![0],
        stop_ids: vec![1],
        context: vec![2],
        tokens: vec![2, 3, 4, 5],
    };
    let split_char = StopCase {
        stop_strings: vec!["é!".to_owned(), "ld".to_owned()],
        tokens: vec![9, 6, 7, 5, 8, 5, 0],
        ..base.clone()
    };
    let ignore_eos = StopCase {
        flags: IGNORE_EOS | CANCEL_AT_END,
        stop_strings: vec![],
        max_tokens: 5,
        tokens: vec![2, 0, 3, 0, 4, 1],
        ..base.clone()
    };
    let sentencepiece = StopCase {
        flags: STRIP_LEADING_SPACE,
        stop_strings: vec!["wor".to_owned()],
        context: vec![],
        tokens: vec![9, 2, 3, 4],
        ..base.clone()
    };
    vec![
        ("stop_string_across_tokens", base.encode()),
        ("split_character", split_char.encode()),
        ("ignore_eos_then_cancel", ignore_eos.encode()),
        ("leading_space", sentencepiece.encode()),
    ]
}
