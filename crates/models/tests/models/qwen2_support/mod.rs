//! Shared by the Qwen2 and Llama tests: a tiny random Qwen2 written as a real GGUF file (or
//! as llama.cpp writes a Llama), and the location of the real Qwen2.5-Coder pair.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

pub const TARGET_FILE: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
pub const DRAFTER_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// The directory `tools/fetch_qwen_pair.sh` fills by default.
pub fn model_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SPECD_MODEL_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/specd/models")
}

/// Paths of the (target, drafter) pair, or `None` after a loud warning on stderr.
pub fn real_pair(test: &str) -> Option<(PathBuf, PathBuf)> {
    let dir = model_dir();
    let (target, drafter) = (dir.join(TARGET_FILE), dir.join(DRAFTER_FILE));
    if target.is_file() && drafter.is_file() {
        return Some((target, drafter));
    }
    // Straight to the stderr handle: the test harness captures `eprintln!` of passing tests.
    let _ = writeln!(
        std::io::stderr(),
        "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
         SKIPPED {test}: real Qwen pair not found in {}, run tools/fetch_qwen_pair.sh\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n",
        dir.display()
    );
    None
}

/// SmolLM2-135M-Instruct, the real Llama-style model `tools/fetch_smollm2.sh` fetches, or
/// `None` after a loud warning on stderr.
pub fn smollm2(test: &str) -> Option<PathBuf> {
    let path = model_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.is_file() {
        return Some(path);
    }
    let _ = writeln!(
        std::io::stderr(),
        "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
         SKIPPED {test}: {} not found, run tools/fetch_smollm2.sh\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n",
        path.display()
    );
    None
}

/// Dimensions and storage formats of a tiny Qwen2.
#[derive(Debug, Clone)]
pub struct TinySpec {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub context_length: usize,
    /// The storage formats of the weights.
    pub layout: TinyLayout,
    /// Omit `output.weight`, so the head is tied to the embedding.
    pub tied_head: bool,
    pub seed: u64,
    /// Written as llama.cpp's converter writes a Llama: `llama.*` keys, and each head's Q/K
    /// rows (and biases) permuted so that rotary pairs are adjacent.
    pub llama_layout: bool,
    /// `rope_freqs.weight`: Llama 3's divisor of each rotary pair's angle.
    pub rope_freq_factors: Option<Vec<f32>>,
}

impl Default for TinySpec {
    fn default() -> Self {
        Self {
            layers: 2,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            ffn: 128,
            vocab: 256,
            context_length: 512,
            layout: TinyLayout::Mixed,
            tied_head: false,
            seed: 7,
            llama_layout: false,
            rope_freq_factors: None,
        }
    }
}

/// Which GGUF formats a tiny model's matmul weights and embedding are stored in (norms and
/// biases are always F32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TinyLayout {
    /// Q8_0, Q4_0, Q5_0 and F32.
    Mixed,
    /// Every weight F32 (for comparison with the reference forward).
    AllF32,
    /// Q4_K and Q6_K (the real pair's formats) with a Q8_0 output projection and a Q5_0 up
    /// projection (a gate and an up that read differently quantized inputs): needs widths
    /// that are multiples of 256 (see [`TinySpec::k_quants`]).
    KQuants,
    /// F16 and BF16.
    Half,
    /// Q4_1 and Q5_1, formats without a native CPU kernel (re-encoded at load).
    Foreign,
}

impl TinySpec {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// The rotary angle per position of each of a head's pairs (base 10000).
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.head_dim();
        (0..d / 2)
            .map(|i| {
                let factor = self
                    .rope_freq_factors
                    .as_ref()
                    .map_or(1.0, |f| f64::from(f[i]));
                1.0 / 10_000f64.powf((2 * i) as f64 / d as f64) / factor
            })
            .collect()
    }

    /// A K-quant model: widths of whole 256-value blocks.
    pub fn k_quants() -> Self {
        Self {
            hidden: 256,
            ffn: 512,
            layout: TinyLayout::KQuants,
            ..Self::default()
        }
    }

    /// The storage format of each weight.
    fn dtype(&self, name: &str) -> GgmlDType {
        if name.ends_with("_norm.weight") || name.ends_with(".bias") {
            return GgmlDType::F32;
        }
        let kind = name.rsplit('.').nth(1).unwrap_or(name);
        match self.layout {
            TinyLayout::AllF32 => GgmlDType::F32,
            TinyLayout::Mixed => match kind {
                "attn_k" | "ffn_gate" => GgmlDType::Q4_0,
                "attn_v" | "ffn_down" => GgmlDType::Q5_0,
                "attn_output" => GgmlDType::F32,
                _ => GgmlDType::Q8_0,
            },
            TinyLayout::KQuants => match kind {
                "attn_v" | "ffn_down" => GgmlDType::Q6K,
                "output" => GgmlDType::Q8_0,
                "ffn_up" => GgmlDType::Q5_0,
                _ => GgmlDType::Q4K,
            },
            TinyLayout::Half => match kind {
                "attn_output" | "ffn_gate" | "output" => GgmlDType::BF16,
                _ => GgmlDType::F16,
            },
            TinyLayout::Foreign => match kind {
                "attn_q" | "ffn_up" => GgmlDType::Q4_1,
                "attn_k" | "token_embd" => GgmlDType::Q5_1,
                _ => GgmlDType::Q8_0,
            },
        }
    }
}

/// A small deterministic generator (SplitMix64), so the tests need no extra crates.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn tokens(&mut self, n: usize, vocab: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (self.next_u64() % vocab as u64) as u32)
            .collect()
    }
}

/// The tensors of a tiny Qwen2, in candle order (`[out, in]` for matmul weights).
pub fn tiny_tensors(spec: &TinySpec) -> Vec<(String, Tensor)> {
    let mut rng = Rng::new(spec.seed);
    let mut tensors = Vec::new();
    let mut add = |name: String, dims: &[usize], scale: f32, offset: f32| {
        let n: usize = dims.iter().product();
        let data: Vec<f32> = (0..n).map(|_| offset + scale * rng.uniform()).collect();
        tensors.push((name, Tensor::from_vec(data, dims, &Device::Cpu).unwrap()));
    };
    let (h, f, kv) = (spec.hidden, spec.ffn, spec.kv_heads * spec.head_dim());
    add("token_embd.weight".into(), &[spec.vocab, h], 1.0, 0.0);
    for l in 0..spec.layers {
        let p = format!("blk.{l}");
        let w = 1.0 / (h as f32).sqrt();
        add(format!("{p}.attn_norm.weight"), &[h], 0.2, 1.0);
        add(format!("{p}.attn_q.weight"), &[h, h], 2.0 * w, 0.0);
        add(format!("{p}.attn_q.bias"), &[h], 0.1, 0.0);
        add(format!("{p}.attn_k.weight"), &[kv, h], 2.0 * w, 0.0);
        add(format!("{p}.attn_k.bias"), &[kv], 0.1, 0.0);
        add(format!("{p}.attn_v.weight"), &[kv, h], w, 0.0);
        add(format!("{p}.attn_v.bias"), &[kv], 0.1, 0.0);
        add(format!("{p}.attn_output.weight"), &[h, h], w, 0.0);
        add(format!("{p}.ffn_norm.weight"), &[h], 0.2, 1.0);
        add(format!("{p}.ffn_gate.weight"), &[f, h], w, 0.0);
        add(format!("{p}.ffn_up.weight"), &[f, h], w, 0.0);
        add(
            format!("{p}.ffn_down.weight"),
            &[h, f],
            1.0 / (f as f32).sqrt(),
            0.0,
        );
    }
    add("output_norm.weight".into(), &[h], 0.2, 1.0);
    if !spec.tied_head {
        add(
            "output.weight".into(),
            &[spec.vocab, h],
            2.0 / (h as f32).sqrt(),
            0.0,
        );
    }
    tensors
}

/// llama.cpp's converter's `permute` of a Q/K weight or bias (rows `[heads * head_dim, ..]`):
/// each head's row `s * head_dim / 2 + i` moves to `2i + s`.
pub fn adjacent_rotary_pairs(t: &Tensor, head_dim: usize) -> Tensor {
    let dims = t.dims().to_vec();
    let rest: usize = dims[1..].iter().product();
    let heads = dims[0] / head_dim;
    t.reshape((heads, 2, head_dim / 2, rest))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape(dims)
        .unwrap()
}

/// Writes the tiny model as GGUF at `path`.
pub fn write_tiny_gguf(path: &Path, spec: &TinySpec) {
    write_tiny_gguf_with(path, spec, &|_, stored| stored);
}

/// [`write_tiny_gguf`], each tensor passed through `then` (its name, as stored) before it is
/// written.
pub fn write_tiny_gguf_with(path: &Path, spec: &TinySpec, then: &dyn Fn(&str, QTensor) -> QTensor) {
    let u32v = |v: usize| Value::U32(v as u32);
    let arch = if spec.llama_layout { "llama" } else { "qwen2" };
    let key = |name: &str| format!("{arch}.{name}");
    let metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (key("block_count"), u32v(spec.layers)),
        (key("embedding_length"), u32v(spec.hidden)),
        (key("feed_forward_length"), u32v(spec.ffn)),
        (key("attention.head_count"), u32v(spec.heads)),
        (key("attention.head_count_kv"), u32v(spec.kv_heads)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (key("rope.freq_base"), Value::F32(10_000.0)),
        (key("context_length"), u32v(spec.context_length)),
    ];
    let mut tensors: Vec<(String, QTensor)> = tiny_tensors(spec)
        .into_iter()
        .map(|(name, t)| {
            let rotary = name.contains(".attn_q.") || name.contains(".attn_k.");
            let t = if spec.llama_layout && rotary {
                let t = if t.rank() == 1 {
                    t.unsqueeze(1).unwrap()
                } else {
                    t
                };
                let permuted = adjacent_rotary_pairs(&t, spec.head_dim());
                if name.ends_with(".bias") {
                    permuted.squeeze(1).unwrap()
                } else {
                    permuted
                }
            } else {
                t
            };
            let q = QTensor::quantize(&t, spec.dtype(&name)).unwrap();
            let q = then(&name, q);
            (name, q)
        })
        .collect();
    if let Some(factors) = &spec.rope_freq_factors {
        let t = Tensor::new(factors.as_slice(), &Device::Cpu).unwrap();
        tensors.push((
            "rope_freqs.weight".into(),
            QTensor::quantize(&t, GgmlDType::F32).unwrap(),
        ));
    }
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut file, &meta_refs, &tensor_refs).unwrap();
}

/// A GGUF file in the temp dir, removed on drop.
pub struct TempGguf(pub PathBuf);

impl TempGguf {
    pub fn tiny(tag: &str, spec: &TinySpec) -> Self {
        let path =
            std::env::temp_dir().join(format!("specd-qwen2-{tag}-{}.gguf", std::process::id()));
        write_tiny_gguf(&path, spec);
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempGguf {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Elements whose bits differ, and the largest absolute difference.
pub fn compare(a: &Tensor, b: &Tensor) -> (usize, f32) {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let differing = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    let max = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    (differing, max)
}

/// The largest magnitude in a tensor (the scale differences are judged against).
pub fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Greedy decoding of `n` tokens after `prompt_ids` one token at a time, then the same as one
/// verify block (the last prompt token and the first `n - 1` generated ones, on a cache
/// holding the rest of the prompt): the generated tokens, the block's logits and the steps'.
pub fn greedy_steps_and_block(
    model: &specd_models::qwen2::Qwen2Model,
    prompt_ids: &[u32],
    n: usize,
) -> (Vec<u32>, Tensor, Tensor) {
    let mut cache = model.new_cache().unwrap();
    let prefill = model.forward_block(prompt_ids, &mut cache).unwrap();
    let last = prompt_ids.len() - 1;
    let mut step_logits = vec![prefill.narrow(0, last, 1).unwrap()];
    let mut generated = vec![argmax_rows(&step_logits[0])[0]];
    while generated.len() < n {
        let logits = model
            .forward_block(&generated[generated.len() - 1..], &mut cache)
            .unwrap();
        generated.push(argmax_rows(&logits)[0]);
        step_logits.push(logits);
    }
    let mut block_cache = model.new_cache().unwrap();
    model
        .forward_block(&prompt_ids[..last], &mut block_cache)
        .unwrap();
    let block_tokens = [&prompt_ids[last..], &generated[..n - 1]].concat();
    let block = model
        .forward_block(&block_tokens, &mut block_cache)
        .unwrap();
    (generated, block, Tensor::cat(&step_logits, 0).unwrap())
}

pub fn argmax_rows(logits: &Tensor) -> Vec<u32> {
    logits
        .argmax(candle_core::D::Minus1)
        .unwrap()
        .to_vec1::<u32>()
        .unwrap()
}
