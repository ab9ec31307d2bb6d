//! Llama on the GGUF engine: tiny random checkpoints written as llama.cpp's converter writes a
//! Llama (`llama.*` keys, Q/K rows permuted so that rotary pairs are adjacent), run against the
//! checkpoint's own forward and against the same weights written as a Qwen2.

use candle_core::{Device, Tensor};
use specd_models::qwen2::{Backend, LoadOptions, Qwen2Error, Qwen2Model};
use specd_models::ModelSource;

use crate::qwen2_support::{compare, max_abs, Rng, TempGguf, TinyLayout, TinySpec};
use crate::qwen2_tiny::reference_logits;

fn logits(file: &TempGguf, backend: Backend, tokens: &[u32]) -> Tensor {
    let options = LoadOptions {
        backend,
        ..LoadOptions::default()
    };
    let model = Qwen2Model::load_with(file.path(), &Device::Cpu, &options).unwrap();
    let mut cache = model.new_cache().unwrap();
    let (prefix, rest) = tokens.split_at(tokens.len() / 2);
    let first = model.forward_block(prefix, &mut cache).unwrap();
    let second = model.forward_block(rest, &mut cache).unwrap();
    Tensor::cat(&[first, second], 0).unwrap()
}

fn llama(spec: TinySpec) -> TinySpec {
    TinySpec {
        llama_layout: true,
        ..spec
    }
}

#[test]
fn a_llama_file_runs_as_the_checkpoint_it_was_converted_from() {
    let spec = llama(TinySpec {
        layout: TinyLayout::AllF32,
        tied_head: true,
        ..TinySpec::default()
    });
    let file = TempGguf::tiny("llama-reference", &spec);
    assert_eq!(
        ModelSource::detect(file.path()).unwrap().family(),
        &specd_models::qwen2::FAMILY
    );
    let tokens = Rng::new(5).tokens(14, spec.vocab);
    let reference = reference_logits(&spec, &tokens);
    for backend in [Backend::Auto, Backend::Candle] {
        let ours = logits(&file, backend, &tokens);
        let (_, max_diff) = compare(&ours, &reference);
        let scale = max_abs(&reference);
        eprintln!("{backend:?}: max |ours - reference| = {max_diff:e} (logit scale {scale})");
        assert!(
            max_diff < 1e-4 * scale.max(1.0),
            "{backend:?}: max diff {max_diff} against the checkpoint's forward"
        );
    }
}

/// The loader undoes the converter's permutation exactly: a Llama file and a Qwen2 file of the
/// same quantized weights give the same bits, on the engine and on candle.
#[test]
fn a_llama_file_gives_the_bits_of_the_same_weights_as_qwen2() {
    for layout in [TinyLayout::Mixed, TinyLayout::Foreign] {
        let qwen2 = TinySpec {
            layout,
            ..TinySpec::default()
        };
        let tokens = Rng::new(9).tokens(12, qwen2.vocab);
        let as_qwen2 = TempGguf::tiny(&format!("llama-as-qwen2-{layout:?}"), &qwen2);
        let as_llama = TempGguf::tiny(&format!("llama-{layout:?}"), &llama(qwen2.clone()));
        for backend in [Backend::Auto, Backend::Candle] {
            let a = logits(&as_qwen2, backend, &tokens);
            let b = logits(&as_llama, backend, &tokens);
            let (differing, max_diff) = compare(&a, &b);
            assert_eq!(
                differing, 0,
                "{layout:?} {backend:?}: {differing} logits differ (max {max_diff:e})"
            );
        }
    }
}

#[test]
fn rope_frequency_factors_scale_each_pairs_angle() {
    let base = llama(TinySpec {
        layout: TinyLayout::AllF32,
        ..TinySpec::default()
    });
    let pairs = base.head_dim() / 2;
    let factors: Vec<f32> = (0..pairs).map(|i| 1.0 + 3.0 * i as f32).collect();
    let scaled = TinySpec {
        rope_freq_factors: Some(factors),
        ..base.clone()
    };
    let tokens = Rng::new(13).tokens(16, base.vocab);
    let file = TempGguf::tiny("llama-rope-factors", &scaled);
    let reference = reference_logits(&scaled, &tokens);
    let unscaled = reference_logits(&base, &tokens);
    let scale = max_abs(&reference);
    for backend in [Backend::Auto, Backend::Candle] {
        let ours = logits(&file, backend, &tokens);
        let (_, max_diff) = compare(&ours, &reference);
        assert!(
            max_diff < 1e-4 * scale.max(1.0),
            "{backend:?}: max diff {max_diff} against the scaled forward"
        );
        let (_, from_unscaled) = compare(&ours, &unscaled);
        assert!(
            from_unscaled > 1e-2 * scale,
            "{backend:?}: the factors changed nothing ({from_unscaled:e})"
        );
    }
}

#[test]
fn heads_the_engine_cannot_run_are_refused_naming_the_field() {
    use candle_core::quantized::gguf_file::{self, Value};
    use specd_models::qwen2::GgufFile;

    let spec = llama(TinySpec::default());
    let file = TempGguf::tiny("llama-partial-rotary", &spec);
    // The same file with rotary embedding on half of each head.
    let gguf = GgufFile::open(file.path()).unwrap();
    let mut metadata: Vec<(String, Value)> = gguf
        .metadata()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.push((
        "llama.rope.dimension_count".into(),
        Value::U32((spec.head_dim() / 2) as u32),
    ));
    let names: Vec<String> = crate::qwen2_support::tiny_tensors(&spec)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let mut reader = std::fs::File::open(file.path()).unwrap();
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let tensors: Vec<(String, candle_core::quantized::QTensor)> = names
        .iter()
        .map(|n| {
            (
                n.clone(),
                content.tensor(&mut reader, n, &Device::Cpu).unwrap(),
            )
        })
        .collect();
    let partial = TempGguf(
        std::env::temp_dir().join(format!("specd-llama-partial-{}.gguf", std::process::id())),
    );
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::fs::File::create(partial.path()).unwrap();
    gguf_file::write(&mut out, &meta_refs, &tensor_refs).unwrap();
    drop(out);
    match Qwen2Model::load(partial.path(), &Device::Cpu) {
        Err(Qwen2Error::InvalidField { field, message }) => {
            assert_eq!(field, "llama.rope.dimension_count", "{message}");
        }
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("a partial rotary embedding was accepted"),
    }
}
