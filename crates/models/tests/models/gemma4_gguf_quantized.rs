//! Gemma 4 targets from Q8_0 GGUF files written by llama.cpp's converter
//! (tools/gemma4_gguf_fixtures.sh), and from Q4_0 / Q5_0 re-encodings of the F32 ones: the
//! quantized matrices run on the CPU engine's packed kernels, close to the float checkpoints
//! and with their greedy continuations, and with the row invariance speculative decoding
//! relies on.

use std::path::PathBuf;

use candle_core::{DType, Device};
use specd_models::gemma4::{
    BlockInput, Gemma4Model, OutputRows, SequenceCache, DEFAULT_PREFILL_CHUNK,
};

use crate::common::gemma4::{greedy_continuation, prefilled, prompts, rows, tokens};
use crate::common::{argmax, f32s, fixture_dir, max_abs_diff, reference, u32s};

/// The dense target (per-layer embeddings, tied head) and the mixture-of-experts one.
const TARGETS: [&str; 2] = ["target-full", "target-moe"];

fn q8_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gemma4-gguf")
        .join(format!("{name}-q8_0.gguf"))
}

fn load(path: &std::path::Path) -> Gemma4Model {
    Gemma4Model::load(path, DType::F32, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Largest logit difference from the f32 checkpoint allowed at any prompt position, per
/// target. Q8_0 weights and int8 activations move these random tiny models' logits by 0.04 to
/// 0.26 (target-full, softcapped at 3) and 0.04 to 0.97 (target-moe, softcapped at 30: 0.97
/// where a layer's router picks other experts, 0.33 elsewhere). The same weights dequantized
/// and run in f32 move target-full's as far, so it is the rounding of the weights, not the
/// kernels. The bounds leave half as much again.
const Q8_0_LOGIT_BOUNDS: [(&str, f32); 2] = [("target-full", 0.4), ("target-moe", 1.5)];

/// transformers' greedy margin (top logit over the runner-up) above which the Q8_0 model must
/// choose the same token. Fed transformers' tokens, it chose another only at steps whose
/// margin was at most 0.26 (out of 384 steps, 22 did).
const DECIDED_MARGIN: f32 = 0.3;

#[test]
fn q8_0_targets_stay_close_to_the_float_logits_at_every_position() {
    for (name, bound) in Q8_0_LOGIT_BOUNDS {
        let q8 = load(&q8_fixture(name));
        let f32_model = load(&fixture_dir(name));
        for ids in prompts(name) {
            let (mut a, mut b) = (q8.new_cache(16), f32_model.new_cache(16));
            let got = rows(&q8.logits(&q8.forward_block(&mut a, &ids).unwrap()).unwrap());
            let want = rows(
                &f32_model
                    .logits(&f32_model.forward_block(&mut b, &ids).unwrap())
                    .unwrap(),
            );
            assert_eq!(got.len(), ids.len());
            for (p, (g, w)) in got.iter().zip(&want).enumerate() {
                let diff = max_abs_diff(g, w);
                assert!(
                    diff < bound,
                    "{name} prompt of {} position {p}: logits differ from f32 by {diff}",
                    ids.len()
                );
            }
        }
    }
}

#[test]
fn q8_0_targets_choose_transformers_greedy_tokens_where_it_is_decided() {
    let mut decided = 0;
    for name in TARGETS {
        let model = load(&q8_fixture(name));
        for prompt in reference(name)["prompts"].as_array().unwrap() {
            let label = format!("{name} {}", prompt["name"]);
            let ids = u32s(&prompt["prompt_ids"]);
            let want = u32s(&prompt["greedy"]);
            let margins = f32s(&prompt["greedy_margins"]);
            let mut cache = model.new_cache(16);
            let mut hidden = model
                .prefill(&mut cache, &ids, DEFAULT_PREFILL_CHUNK)
                .unwrap();
            // Fed transformers' tokens, so one near tie does not change every later step.
            for (step, (&token, &margin)) in want.iter().zip(&margins).enumerate() {
                let got = argmax(&rows(&model.logits(&hidden).unwrap())[0]);
                if margin > DECIDED_MARGIN {
                    decided += 1;
                    assert_eq!(got, token, "{label} step {step} (margin {margin})");
                }
                hidden = model.forward_block(&mut cache, &[token]).unwrap();
            }
        }
    }
    assert_eq!(decided, 144, "steps with a decided greedy token");
}

#[test]
fn q8_0_target_full_continues_its_long_prompt_exactly_like_transformers() {
    // Free-running, all 64 tokens: on this prompt no near tie falls the other way.
    let model = load(&q8_fixture("target-full"));
    let prompt = &reference("target-full")["prompts"][2];
    assert_eq!(prompt["name"], "long");
    let ids = u32s(&prompt["prompt_ids"]);
    let want = u32s(&prompt["greedy"]);
    assert_eq!(greedy_continuation(&model, &ids, want.len()), want);
}

#[test]
fn q8_0_block_forward_equals_one_token_steps_bit_for_bit() {
    for name in TARGETS {
        let model = load(&q8_fixture(name));
        let vocab = model.config().vocab_size;
        for prompt in prompts(name) {
            for bs in [1, 2, 4, 8, 16] {
                let block = tokens(bs as u32 + prompt.len() as u32, bs, vocab);
                let mut block_cache = prefilled(&model, &prompt);
                let block_hidden = rows(&model.forward_block(&mut block_cache, &block).unwrap());
                let mut step_cache = prefilled(&model, &prompt);
                for (i, &t) in block.iter().enumerate() {
                    let step_hidden = rows(&model.forward_block(&mut step_cache, &[t]).unwrap());
                    assert_eq!(
                        step_hidden[0], block_hidden[i],
                        "{name} bs {bs}: position {i} differs"
                    );
                }
                let next = |cache: &mut SequenceCache| {
                    rows(
                        &model
                            .logits(&model.forward_block(cache, &[5]).unwrap())
                            .unwrap(),
                    )
                };
                assert_eq!(
                    next(&mut block_cache),
                    next(&mut step_cache),
                    "{name} bs {bs}: the next step differs"
                );
            }
        }
    }
}

#[test]
fn q8_0_batched_forward_equals_each_row_alone() {
    for name in TARGETS {
        let model = load(&q8_fixture(name));
        let vocab = model.config().vocab_size;
        let ps = prompts(name);
        let blocks: Vec<Vec<u32>> = [3usize, 1, 8]
            .iter()
            .enumerate()
            .map(|(i, &n)| tokens(i as u32 + 40, n, vocab))
            .collect();
        let mut batch_caches: Vec<SequenceCache> =
            ps.iter().map(|p| prefilled(&model, p)).collect();
        let batched = {
            let mut inputs: Vec<BlockInput<'_>> = batch_caches
                .iter_mut()
                .zip(&blocks)
                .map(|(cache, b)| BlockInput::chain(cache, b))
                .collect();
            model.forward(&mut inputs, OutputRows::All).unwrap()
        };
        for (r, p) in ps.iter().enumerate() {
            let mut alone = prefilled(&model, p);
            let solo = rows(&model.forward_block(&mut alone, &blocks[r]).unwrap());
            assert_eq!(rows(&batched[r]), solo, "{name} row {r} differs alone");
            let next = [4u32, 5];
            assert_eq!(
                rows(&model.forward_block(&mut batch_caches[r], &next).unwrap()),
                rows(&model.forward_block(&mut alone, &next).unwrap()),
                "{name} row {r}: the cache a batch leaves differs"
            );
        }
    }
}

#[test]
fn q8_0_prefill_in_chunks_equals_one_forward() {
    // Packed weights are row-exact at any row count, so chunking a prefill changes no bit.
    for name in TARGETS {
        let model = load(&q8_fixture(name));
        let ids = prompts(name).pop().unwrap();
        let last = |chunk: usize| {
            let mut cache = model.new_cache(16);
            let hidden = model.prefill(&mut cache, &ids, chunk).unwrap();
            rows(&model.logits(&hidden).unwrap())
        };
        let whole = last(DEFAULT_PREFILL_CHUNK);
        for chunk in [1, 5, 7] {
            assert_eq!(last(chunk), whole, "{name}: chunks of {chunk}");
        }
    }
}

#[test]
fn q8_0_embeddings_decode_the_looked_up_rows() {
    // The quantized table decodes to within half a Q8_0 step of the f32 weights.
    let q8 = load(&q8_fixture("target-full"));
    let f32_model = load(&fixture_dir("target-full"));
    for token in [0usize, 2, 17, 255] {
        let got: Vec<f32> = q8.embedding_table().get(token).unwrap().to_vec1().unwrap();
        let want: Vec<f32> = f32_model
            .embedding_table()
            .get(token)
            .unwrap()
            .to_vec1()
            .unwrap();
        let step = want.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
        let diff = max_abs_diff(&got, &want);
        assert!(diff <= step, "token {token}: {diff} from f32 (step {step})");
    }
    assert!(q8.embedding_table().get(256).is_err());
}

/// Largest logit difference between a file's packed weights and the same weights dequantized
/// and run in f32: int8 activations moved them by at most 0.30 (target-moe, Q4_0).
const PACKED_VS_DEQUANTIZED_BOUND: f32 = 0.5;

#[test]
fn q4_0_and_q5_0_files_match_their_dequantized_weights() {
    use crate::common::gguf_parts::Parts;
    use crate::common::tempdir::TempDir;
    use candle_core::quantized::{GgmlDType, QTensor};

    let dir = TempDir::new("gemma4-gguf-q4");
    let encode = |parts: &mut Parts, dtype: GgmlDType, all: bool| {
        for (_, t) in parts.tensors.iter_mut() {
            let dims = t.shape().dims().to_vec();
            if all || (dims.len() >= 2 && dims[dims.len() - 1] % 32 == 0) {
                let dense = t.dequantize(&Device::Cpu).unwrap();
                *t = QTensor::quantize(&dense, dtype).unwrap();
            }
        }
    };
    for name in TARGETS {
        let ids = prompts(name).remove(1);
        let f32_file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/gemma4-gguf/{name}-f32.gguf"));
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q5_0] {
            // Every matrix and expert weight whose rows are whole 32-value blocks, as a
            // converter writes them; then the same values back in F32.
            let mut parts = Parts::read(&f32_file);
            encode(&mut parts, dtype, false);
            let packed = load(&parts.write(&dir, &format!("{name}-{dtype:?}.gguf")));
            encode(&mut parts, GgmlDType::F32, true);
            let dense = load(&parts.write(&dir, &format!("{name}-{dtype:?}-f32.gguf")));
            let logits = |model: &Gemma4Model| {
                let mut cache = model.new_cache(16);
                rows(
                    &model
                        .logits(&model.forward_block(&mut cache, &ids).unwrap())
                        .unwrap(),
                )
            };
            for (p, (g, w)) in logits(&packed).iter().zip(&logits(&dense)).enumerate() {
                let diff = max_abs_diff(g, w);
                assert!(
                    diff < PACKED_VS_DEQUANTIZED_BOUND,
                    "{name} {dtype:?} position {p}: {diff} from the dequantized weights"
                );
            }

            let block = tokens(9, 4, packed.config().vocab_size);
            let mut block_cache = prefilled(&packed, &ids);
            let block_hidden = rows(&packed.forward_block(&mut block_cache, &block).unwrap());
            let mut step_cache = prefilled(&packed, &ids);
            for (i, &t) in block.iter().enumerate() {
                let step = rows(&packed.forward_block(&mut step_cache, &[t]).unwrap());
                assert_eq!(step[0], block_hidden[i], "{name} {dtype:?}: position {i}");
            }
        }
    }
}

#[test]
fn greedy_tokens_are_the_argmax_of_the_softcapped_logits() {
    use specd_models::CausalLm;
    // The packed heads' argmax epilogue against an argmax over the logits, at every position
    // of every prompt: float and Q8_0 heads, softcapped at 3 (target-full) and 30 (target-moe).
    for name in TARGETS {
        for path in [fixture_dir(name), q8_fixture(name)] {
            let model = load(&path);
            for ids in prompts(name) {
                let mut cache = model.new_cache(16);
                let hidden = model.forward_block(&mut cache, &ids).unwrap();
                let want: Vec<u32> = rows(&model.logits(&hidden).unwrap())
                    .iter()
                    .map(|row| argmax(row))
                    .collect();
                let got = CausalLm::argmax(&model, &hidden).unwrap();
                assert_eq!(got, want, "{}", path.display());
            }
        }
    }
}
