//! The Qwen2 model on tiny random GGUF files written by the test: correctness against a plain
//! reference forward, and the invariances speculative decoding relies on (block == steps,
//! rollback, batch row == row alone).

use std::collections::HashMap;

use crate::qwen2_support::{
    compare, tiny_tensors, write_tiny_gguf_with, Rng, TempGguf, TinyLayout, TinySpec,
};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor, D};
use specd_models::qwen2::{Backend, BlockRow, LoadOptions, Qwen2Error, Qwen2Model};
use specd_models::MatrixPrecision;

fn load(file: &TempGguf) -> Qwen2Model {
    Qwen2Model::load(file.path(), &Device::Cpu).unwrap()
}

/// Runs `tokens` one at a time and stacks the logits.
fn step_logits(
    model: &Qwen2Model,
    tokens: &[u32],
    cache: &mut specd_models::qwen2::KvCache,
) -> Tensor {
    let rows: Vec<Tensor> = tokens
        .iter()
        .map(|t| model.forward_block(&[*t], cache).unwrap())
        .collect();
    Tensor::cat(&rows, 0).unwrap()
}

/// A plain, cache-free f32 Qwen2 forward over dense weights: embedding, RMSNorm, biased
/// Q/K/V, rotate-half RoPE, grouped-query causal attention, SwiGLU, tied or separate head.
pub(crate) fn reference_logits(spec: &TinySpec, tokens: &[u32]) -> Tensor {
    let w: HashMap<String, Tensor> = tiny_tensors(spec).into_iter().collect();
    let (n, d, heads, kv_heads) = (tokens.len(), spec.head_dim(), spec.heads, spec.kv_heads);
    let eps = 1e-6;
    let rms = |x: &Tensor, g: &str| -> Tensor {
        let ms = x.sqr().unwrap().mean_keepdim(1).unwrap();
        x.broadcast_div(&(ms + eps).unwrap().sqrt().unwrap())
            .unwrap()
            .broadcast_mul(&w[g])
            .unwrap()
    };
    let lin = |x: &Tensor, name: &str| -> Tensor {
        let y = x
            .matmul(&w[&format!("{name}.weight")].t().unwrap())
            .unwrap();
        match w.get(&format!("{name}.bias")) {
            Some(b) => y.broadcast_add(b).unwrap(),
            None => y,
        }
    };
    let half = d / 2;
    let inv_freq = spec.inv_freq();
    let mut cos = Vec::new();
    let mut sin = Vec::new();
    for p in 0..n {
        for f in &inv_freq {
            let angle = p as f64 * f;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    let cos = Tensor::from_vec(cos, (n, 1, half), &Device::Cpu).unwrap();
    let sin = Tensor::from_vec(sin, (n, 1, half), &Device::Cpu).unwrap();
    let rope = |x: &Tensor| -> Tensor {
        let x1 = x.narrow(2, 0, half).unwrap();
        let x2 = x.narrow(2, half, half).unwrap();
        let a = (x1.broadcast_mul(&cos).unwrap() - x2.broadcast_mul(&sin).unwrap()).unwrap();
        let b = (x2.broadcast_mul(&cos).unwrap() + x1.broadcast_mul(&sin).unwrap()).unwrap();
        Tensor::cat(&[a, b], 2).unwrap()
    };
    let mask: Vec<f32> = (0..n * n)
        .map(|i| {
            if i % n <= i / n {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    let mask = Tensor::from_vec(mask, (n, n), &Device::Cpu).unwrap();

    let ids = Tensor::new(tokens, &Device::Cpu).unwrap();
    let mut x = w["token_embd.weight"].index_select(&ids, 0).unwrap();
    for l in 0..spec.layers {
        let p = format!("blk.{l}");
        let h = rms(&x, &format!("{p}.attn_norm.weight"));
        let q = rope(
            &lin(&h, &format!("{p}.attn_q"))
                .reshape((n, heads, d))
                .unwrap(),
        );
        let k = rope(
            &lin(&h, &format!("{p}.attn_k"))
                .reshape((n, kv_heads, d))
                .unwrap(),
        );
        let v = lin(&h, &format!("{p}.attn_v"))
            .reshape((n, kv_heads, d))
            .unwrap();
        let mut outs = Vec::new();
        for head in 0..heads {
            let g = head / (heads / kv_heads);
            let qh = q.narrow(1, head, 1).unwrap().squeeze(1).unwrap();
            let kh = k.narrow(1, g, 1).unwrap().squeeze(1).unwrap();
            let vh = v.narrow(1, g, 1).unwrap().squeeze(1).unwrap();
            let scores = (qh.matmul(&kh.t().unwrap()).unwrap() / (d as f64).sqrt()).unwrap();
            let probs = candle_nn::ops::softmax_last_dim(&(scores + &mask).unwrap()).unwrap();
            outs.push(probs.matmul(&vh).unwrap());
        }
        let attn = lin(&Tensor::cat(&outs, 1).unwrap(), &format!("{p}.attn_output"));
        x = (x + attn).unwrap();
        let h = rms(&x, &format!("{p}.ffn_norm.weight"));
        let gate = lin(&h, &format!("{p}.ffn_gate")).silu().unwrap();
        let mlp = (gate * lin(&h, &format!("{p}.ffn_up"))).unwrap();
        x = (x + lin(&mlp, &format!("{p}.ffn_down"))).unwrap();
    }
    let x = rms(&x, "output_norm.weight");
    let head = if spec.tied_head {
        &w["token_embd.weight"]
    } else {
        &w["output.weight"]
    };
    x.matmul(&head.t().unwrap()).unwrap()
}

#[test]
fn dense_model_matches_reference_forward() {
    for tied_head in [false, true] {
        let spec = TinySpec {
            layout: TinyLayout::AllF32,
            tied_head,
            ..TinySpec::default()
        };
        let file = TempGguf::tiny(&format!("reference-{tied_head}"), &spec);
        let model = load(&file);
        let tokens = Rng::new(11).tokens(13, spec.vocab);
        let mut cache = model.new_cache().unwrap();
        let prefix = model.forward_block(&tokens[..9], &mut cache).unwrap();
        let rest = model.forward_block(&tokens[9..], &mut cache).unwrap();
        let ours = Tensor::cat(&[prefix, rest], 0).unwrap();
        let reference = reference_logits(&spec, &tokens);
        let (_, max_diff) = compare(&ours, &reference);
        let scale = crate::qwen2_support::max_abs(&reference);
        eprintln!(
            "tied_head={tied_head}: max |ours - reference| = {max_diff:e} (logit scale {scale})"
        );
        assert!(
            max_diff < 1e-4 * scale.max(1.0),
            "max diff {max_diff} against reference"
        );
    }
}

/// Every native format: the mixed Q8_0/Q4_0/Q5_0/F32 layout, the real pair's K-quants, F16
/// and BF16, and all-F32 (with F32 weights no activation quantization can round a small
/// difference away, so bit-equality there is a sharper check).
fn layouts() -> [TinySpec; 4] {
    [
        TinySpec::default(),
        TinySpec::k_quants(),
        TinySpec {
            layout: TinyLayout::Half,
            ..TinySpec::default()
        },
        TinySpec {
            layout: TinyLayout::AllF32,
            ..TinySpec::default()
        },
    ]
}

#[test]
fn block_forward_equals_one_token_steps() {
    for spec in layouts() {
        block_equals_steps(&spec);
    }
}

fn block_equals_steps(spec: &TinySpec) {
    let file = TempGguf::tiny(&format!("block-steps-{:?}", spec.layout), spec);
    let model = load(&file);
    let tokens = Rng::new(3).tokens(20, spec.vocab);
    let (prefix, block) = tokens.split_at(8);

    // From an empty cache, and after a prefix (the verify case: a block at an offset).
    let mut block_cache = model.new_cache().unwrap();
    let mut step_cache = model.new_cache().unwrap();
    let whole = model.forward_block(prefix, &mut block_cache).unwrap();
    let steps = step_logits(&model, prefix, &mut step_cache);
    let (differing, max_diff) = compare(&whole, &steps);
    eprintln!(
        "{:?}: prefill block of {} vs steps: {differing} differing elements, max diff {max_diff:e}",
        spec.layout,
        prefix.len()
    );
    assert_eq!(differing, 0, "block and step logits are not bit-identical");

    let verify = model.forward_block(block, &mut block_cache).unwrap();
    let steps = step_logits(&model, block, &mut step_cache);
    let (differing, max_diff) = compare(&verify, &steps);
    eprintln!(
        "{:?}: block of {} at offset {} vs steps: {differing} differing elements, max diff {max_diff:e}",
        spec.layout,
        block.len(),
        prefix.len()
    );
    assert_eq!(differing, 0, "block and step logits are not bit-identical");
    assert_eq!(block_cache.len(), tokens.len());
    assert_eq!(step_cache.len(), tokens.len());
}

#[test]
fn truncate_then_continue_equals_never_going_ahead() {
    for spec in layouts() {
        truncate_then_continue(&spec);
    }
}

fn truncate_then_continue(spec: &TinySpec) {
    let file = TempGguf::tiny(&format!("truncate-{:?}", spec.layout), spec);
    let model = load(&file);
    let mut rng = Rng::new(5);
    let prompt = rng.tokens(6, spec.vocab);
    let draft = rng.tokens(5, spec.vocab);
    let next = rng.tokens(3, spec.vocab);

    // Verify a 5-token draft, accept 2 of them, roll back the other 3, continue.
    let mut rolled = model.new_cache().unwrap();
    model.forward_block(&prompt, &mut rolled).unwrap();
    model.forward_block(&draft, &mut rolled).unwrap();
    rolled.truncate(prompt.len() + 2).unwrap();
    assert_eq!(rolled.len(), prompt.len() + 2);
    let after_rollback = model.forward_block(&next, &mut rolled).unwrap();

    let mut straight = model.new_cache().unwrap();
    model.forward_block(&prompt, &mut straight).unwrap();
    model.forward_block(&draft[..2], &mut straight).unwrap();
    let never_ahead = model.forward_block(&next, &mut straight).unwrap();

    let (differing, max_diff) = compare(&after_rollback, &never_ahead);
    eprintln!(
        "{:?}: rollback then continue: {differing} differing elements, max diff {max_diff:e}",
        spec.layout
    );
    assert_eq!(differing, 0);

    // Rolling back to nothing behaves like a fresh cache.
    rolled.truncate(0).unwrap();
    let fresh = model.forward_block(&prompt, &mut rolled).unwrap();
    let mut new = model.new_cache().unwrap();
    assert_eq!(
        compare(&fresh, &model.forward_block(&prompt, &mut new).unwrap()).0,
        0
    );

    let err = rolled.truncate(rolled.len() + 1).unwrap_err();
    assert!(
        matches!(err, Qwen2Error::TruncateBeyondLength { .. }),
        "{err}"
    );
}

#[test]
fn batched_rows_equal_rows_alone() {
    for spec in layouts() {
        batched_rows_equal_alone(&spec);
    }
}

fn batched_rows_equal_alone(spec: &TinySpec) {
    let file = TempGguf::tiny(&format!("batch-{:?}", spec.layout), spec);
    let model = load(&file);
    let mut rng = Rng::new(9);
    // (history already in the cache, new block): different lengths and positions.
    let shapes = [(3usize, 4usize), (7, 1), (0, 6)];
    let rows: Vec<(Vec<u32>, Vec<u32>)> = shapes
        .iter()
        .map(|&(past, new)| (rng.tokens(past, spec.vocab), rng.tokens(new, spec.vocab)))
        .collect();

    let mut batch_caches = Vec::new();
    let mut alone = Vec::new();
    for (history, block) in &rows {
        let mut cache = model.new_cache().unwrap();
        if !history.is_empty() {
            model.forward_block(history, &mut cache).unwrap();
        }
        batch_caches.push(cache);
        let mut own = model.new_cache().unwrap();
        if !history.is_empty() {
            model.forward_block(history, &mut own).unwrap();
        }
        alone.push(model.forward_block(block, &mut own).unwrap());
    }
    let mut batch: Vec<BlockRow<'_>> = rows
        .iter()
        .zip(batch_caches.iter_mut())
        .map(|((_, block), cache)| BlockRow::chain(cache, block))
        .collect();
    let batched = model.forward_batch(&mut batch).unwrap();
    drop(batch);

    for (r, (b, a)) in batched.iter().zip(&alone).enumerate() {
        let (differing, max_diff) = compare(b, a);
        eprintln!(
            "{:?}: row {r} {:?}: {differing} differing elements, max diff {max_diff:e}",
            spec.layout, shapes[r]
        );
        assert_eq!(differing, 0, "row {r} differs from running it alone");
        assert_eq!(batch_caches[r].len(), shapes[r].0 + shapes[r].1);
    }

    // The caches written by the batch continue exactly like the caches of the rows alone.
    let next = rng.tokens(2, spec.vocab);
    let mut own = model.new_cache().unwrap();
    model
        .forward_block(&[rows[1].0.clone(), rows[1].1.clone()].concat(), &mut own)
        .unwrap();
    let continued = model.forward_block(&next, &mut batch_caches[1]).unwrap();
    assert_eq!(
        compare(&continued, &model.forward_block(&next, &mut own).unwrap()).0,
        0
    );
}

#[test]
fn prefill_chunking_does_not_change_logits_or_cache() {
    for spec in layouts() {
        let file = TempGguf::tiny(&format!("chunks-{:?}", spec.layout), &spec);
        let model = load(&file);
        let tokens = Rng::new(31).tokens(40, spec.vocab);
        let next = Rng::new(32).tokens(3, spec.vocab);
        let run = |chunk: usize| {
            let mut cache = model.new_cache().unwrap();
            let pieces: Vec<Tensor> = tokens
                .chunks(chunk)
                .map(|piece| model.forward_block(piece, &mut cache).unwrap())
                .collect();
            // What the cache holds shows in the logits of the tokens after it.
            let after = model.forward_block(&next, &mut cache).unwrap();
            (Tensor::cat(&pieces, 0).unwrap(), after)
        };
        let (whole, whole_after) = run(tokens.len());
        for chunk in [1, 4, 16] {
            let (logits, after) = run(chunk);
            assert_eq!(
                compare(&logits, &whole).0,
                0,
                "{:?}: chunks of {chunk}",
                spec.layout
            );
            assert_eq!(
                compare(&after, &whole_after).0,
                0,
                "{:?}: cache after chunks of {chunk}",
                spec.layout
            );
        }
    }
}

#[test]
fn candle_backend_agrees_with_the_engine() {
    // candle's kernels are an independent implementation: the engine must agree with them
    // to within the activation quantization both apply (exactly-ish on F32 weights).
    for spec in layouts() {
        let file = TempGguf::tiny(&format!("candle-{:?}", spec.layout), &spec);
        let options = LoadOptions {
            backend: Backend::Candle,
            warm_up: false,
            ..LoadOptions::default()
        };
        let candle = Qwen2Model::load_with(file.path(), &Device::Cpu, &options).unwrap();
        assert!(candle.engine_info().is_none());
        let engine = load(&file);
        assert!(engine.engine_info().is_some());
        let tokens = Rng::new(4).tokens(12, spec.vocab);
        let run = |model: &Qwen2Model| {
            let mut cache = model.new_cache().unwrap();
            let a = model.forward_block(&tokens[..7], &mut cache).unwrap();
            let b = model.forward_block(&tokens[7..], &mut cache).unwrap();
            Tensor::cat(&[a, b], 0).unwrap()
        };
        let (ours, theirs) = (run(&engine), run(&candle));
        let (_, max_diff) = compare(&ours, &theirs);
        let scale = crate::qwen2_support::max_abs(&theirs);
        let tolerance = match spec.layout {
            TinyLayout::AllF32 => 1e-4 * scale.max(1.0),
            _ => 0.05 * scale,
        };
        eprintln!(
            "{:?}: engine vs candle: max diff {max_diff:e} (logit scale {scale})",
            spec.layout
        );
        assert!(
            max_diff < tolerance,
            "{:?}: engine and candle differ by {max_diff}",
            spec.layout
        );
        let (a, b) = (
            crate::qwen2_support::argmax_rows(&ours),
            crate::qwen2_support::argmax_rows(&theirs),
        );
        let agree = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        assert!(
            agree + 1 >= a.len(),
            "{:?}: greedy tokens agree on {agree} of {}",
            spec.layout,
            a.len()
        );
    }
}

#[test]
fn formats_without_a_native_kernel_are_reencoded_and_stay_close() {
    let spec = TinySpec {
        layout: TinyLayout::Foreign,
        ..TinySpec::default()
    };
    let file = TempGguf::tiny("foreign", &spec);
    let engine = load(&file);
    let info = engine.engine_info().unwrap();
    assert_eq!(info.reencoded_tensors, 3 * spec.layers + 1, "{info:?}");
    let options = LoadOptions {
        backend: Backend::Candle,
        warm_up: false,
        ..LoadOptions::default()
    };
    let candle = Qwen2Model::load_with(file.path(), &Device::Cpu, &options).unwrap();
    let tokens = Rng::new(21).tokens(10, spec.vocab);
    let run = |model: &Qwen2Model| {
        let mut cache = model.new_cache().unwrap();
        model.forward_block(&tokens, &mut cache).unwrap()
    };
    let (ours, theirs) = (run(&engine), run(&candle));
    let (_, max_diff) = compare(&ours, &theirs);
    let scale = crate::qwen2_support::max_abs(&theirs);
    eprintln!("re-encoded Q4_1/Q5_1: max diff {max_diff:e} against candle (scale {scale})");
    assert!(
        max_diff < 0.05 * scale,
        "re-encoding moved logits by {max_diff}"
    );
}

/// A matrix as `MatrixPrecision::FourBit` holds it: stored wider than 4.5 bits a weight,
/// decoded and encoded again as Q4_K (rows of whole 256-value blocks) or Q4_0.
fn four_bit(name: &str, stored: QTensor) -> QTensor {
    let matrix = stored.shape().dims().len() == 2 && name != "token_embd.weight";
    let inp = *stored.shape().dims().last().unwrap();
    let bits = |d: GgmlDType| (d.type_size() * 8) as f64 / d.block_size() as f64;
    let four = if inp.is_multiple_of(256) {
        GgmlDType::Q4K
    } else {
        GgmlDType::Q4_0
    };
    if !matrix || bits(stored.dtype()) <= bits(four) {
        return stored;
    }
    let dense = stored.dequantize(&Device::Cpu).unwrap();
    QTensor::quantize(&dense, four).unwrap()
}

#[test]
fn four_bit_matrices_run_as_a_file_stored_at_four_bits_would() {
    // Mixed: Q5_0, Q8_0 and F32 matrices become Q4_0 (5 a layer and the head; attn_k and
    // ffn_gate are Q4_0 already). K-quants: Q6_K and Q8_0 become Q4_K, and so does the Q5_0 up
    // projection (3 a layer and the head).
    for (spec, narrowed) in [(TinySpec::default(), 5), (TinySpec::k_quants(), 3)] {
        let tag = format!("four-bit-{:?}", spec.layout);
        let file = TempGguf::tiny(&tag, &spec);
        let stored_at_four = TempGguf(std::env::temp_dir().join(format!(
            "specd-qwen2-{tag}-stored-{}.gguf",
            std::process::id()
        )));
        write_tiny_gguf_with(stored_at_four.path(), &spec, &four_bit);
        let options = LoadOptions {
            precision: MatrixPrecision::FourBit,
            ..LoadOptions::default()
        };
        let four = Qwen2Model::load_with(file.path(), &Device::Cpu, &options).unwrap();
        let stored = load(&file);
        let reference = load(&stored_at_four);
        let info = four.engine_info().unwrap();
        assert_eq!(
            info.narrowed_tensors,
            narrowed * spec.layers + 1,
            "{info:?}"
        );
        assert_eq!(stored.engine_info().unwrap().narrowed_tensors, 0);
        assert_eq!(
            info.streamed_bytes,
            reference.engine_info().unwrap().streamed_bytes
        );
        assert!(
            info.streamed_bytes < stored.engine_info().unwrap().streamed_bytes,
            "{info:?}"
        );
        let tokens = Rng::new(5).tokens(12, spec.vocab);
        let run = |model: &Qwen2Model| {
            let mut cache = model.new_cache().unwrap();
            model.forward_block(&tokens, &mut cache).unwrap()
        };
        let (differing, max_diff) = compare(&run(&four), &run(&reference));
        assert_eq!(
            differing, 0,
            "{:?}: narrowed at load vs stored at four bits: max diff {max_diff:e}",
            spec.layout
        );
    }
}

#[test]
fn argmax_is_the_argmax_of_the_logits() {
    for spec in layouts() {
        let file = TempGguf::tiny(&format!("argmax-{:?}", spec.layout), &spec);
        let model = load(&file);
        let tokens = Rng::new(41).tokens(9, spec.vocab);
        let mut cache = model.new_cache().unwrap();
        let hidden = model.forward_block_hidden(&tokens, &mut cache).unwrap();
        let logits = model.logits(&hidden).unwrap();
        assert_eq!(
            model.argmax(&hidden).unwrap(),
            crate::qwen2_support::argmax_rows(&logits)
        );
        let mut again = model.new_cache().unwrap();
        let next = model.forward_block_argmax(&tokens, &mut again).unwrap();
        assert_eq!(
            next,
            *crate::qwen2_support::argmax_rows(&logits).last().unwrap()
        );
        // A restricted vocabulary: the argmax of the logits' first `below` columns, also
        // for limits that end inside a tile of the packed head.
        for below in [1, 7, 16, 33, spec.vocab - 1, spec.vocab, spec.vocab + 5] {
            let prefix = logits.narrow(1, 0, below.min(spec.vocab)).unwrap();
            assert_eq!(
                model.argmax_below(&hidden, below).unwrap(),
                crate::qwen2_support::argmax_rows(&prefix),
                "{:?}, ids below {below}",
                spec.layout
            );
        }
    }
}

#[test]
fn cache_grows_past_its_initial_capacity() {
    let spec = TinySpec {
        layers: 1,
        ..TinySpec::default()
    };
    let file = TempGguf::tiny("grow", &spec);
    let model = load(&file);
    let tokens = Rng::new(8).tokens(300, spec.vocab);
    let mut cache = model.new_cache().unwrap();
    let initial = cache.capacity();
    let bytes = cache.allocated_bytes();
    assert_eq!(
        bytes,
        2 * spec.layers * spec.kv_heads * initial * spec.head_dim() * 4
    );
    let first = model.forward_block(&tokens[..250], &mut cache).unwrap();
    let second = model.forward_block(&tokens[250..], &mut cache).unwrap();
    assert!(cache.capacity() > initial, "cache did not grow");
    assert!(cache.allocated_bytes() > bytes);
    let mut whole_cache = model.new_cache().unwrap();
    let whole = model.forward_block(&tokens, &mut whole_cache).unwrap();
    assert_eq!(
        compare(&Tensor::cat(&[first, second], 0).unwrap(), &whole).0,
        0
    );
    assert_eq!(whole.argmax(D::Minus1).unwrap().dims(), &[300]);
}

#[test]
fn bad_input_is_an_error_naming_the_field() {
    let spec = TinySpec {
        context_length: 16,
        ..TinySpec::default()
    };
    let file = TempGguf::tiny("errors", &spec);
    let model = load(&file);
    let mut cache = model.new_cache().unwrap();

    let err = model.forward_block(&[1, 2, 256], &mut cache).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rows[0].tokens[2]: id 256 is outside the vocabulary of 256 tokens"
    );
    let err = model.forward_block(&[], &mut cache).unwrap_err();
    assert!(matches!(err, Qwen2Error::EmptyBlock { row: 0 }), "{err}");
    model.forward_block(&[1; 10], &mut cache).unwrap();
    let err = model.forward_block(&[1; 7], &mut cache).unwrap_err();
    assert!(
        matches!(
            err,
            Qwen2Error::ContextOverflow {
                needed: 17,
                context_length: 16,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        cache.len(),
        10,
        "a failed forward must not change the cache"
    );

    let other_spec = TinySpec {
        layers: 1,
        ..TinySpec::default()
    };
    let other_file = TempGguf::tiny("errors-other", &other_spec);
    let mut foreign = load(&other_file).new_cache().unwrap();
    let err = model.forward_block(&[1], &mut foreign).unwrap_err();
    assert!(
        matches!(err, Qwen2Error::CacheMismatch { row: 0, .. }),
        "{err}"
    );

    let err = model
        .logits(&Tensor::zeros((2, 3), candle_core::DType::F32, &Device::Cpu).unwrap())
        .unwrap_err();
    assert!(matches!(err, Qwen2Error::HiddenShape { .. }), "{err}");

    let missing = std::env::temp_dir().join("specd-qwen2-no-such-file.gguf");
    let err = Qwen2Model::load(&missing, &Device::Cpu).err().unwrap();
    assert!(
        err.to_string().contains("specd-qwen2-no-such-file.gguf"),
        "{err}"
    );
}

#[test]
fn gguf_with_a_missing_tensor_or_field_is_rejected_by_name() {
    use candle_core::quantized::gguf_file::{self, Value};
    use candle_core::quantized::{GgmlDType, QTensor};
    let spec = TinySpec::default();
    let path = std::env::temp_dir().join(format!("specd-qwen2-broken-{}.gguf", std::process::id()));
    let write = |skip_tensor: &str, skip_field: &str| {
        let tensors: Vec<(String, QTensor)> = tiny_tensors(&spec)
            .into_iter()
            .filter(|(n, _)| n != skip_tensor)
            .map(|(n, t)| (n, QTensor::quantize(&t, GgmlDType::F32).unwrap()))
            .collect();
        let metadata = [
            ("general.architecture", Value::String("qwen2".into())),
            ("qwen2.block_count", Value::U32(2)),
            ("qwen2.embedding_length", Value::U32(64)),
            ("qwen2.feed_forward_length", Value::U32(128)),
            ("qwen2.attention.head_count", Value::U32(4)),
            ("qwen2.attention.head_count_kv", Value::U32(2)),
            ("qwen2.attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
            ("qwen2.context_length", Value::U32(64)),
        ];
        let meta: Vec<(&str, &Value)> = metadata
            .iter()
            .filter(|(k, _)| *k != skip_field)
            .map(|(k, v)| (*k, v))
            .collect();
        let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        gguf_file::write(&mut std::fs::File::create(&path).unwrap(), &meta, &refs).unwrap();
        Qwen2Model::load(&path, &Device::Cpu)
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(
        write("blk.1.ffn_up.weight", "").as_deref(),
        Some("GGUF tensor blk.1.ffn_up.weight: missing")
    );
    assert_eq!(
        write("", "qwen2.attention.head_count_kv").as_deref(),
        Some("GGUF metadata field qwen2.attention.head_count_kv: missing")
    );
    assert_eq!(
        write("", ""),
        None,
        "the complete file loads (rope.freq_base has a default)"
    );
    let _ = std::fs::remove_file(&path);
}
