//! Attention of a block of queries over a cache's K/V rows, as one [`AttentionSpan`] says
//! which rows each query sees (causal, windowed, or a tree's ancestors).

use candle_core::{DType, Tensor};

use crate::exact::{exact_attention, AttentionSpan};

/// `q [t, hq, d]` over `k`, `v` `[hkv, s, d]` (key row 0 in slot `span.key_start`), giving
/// `[t, hq, d]`: the row-exact kernels where `exact` (CPU f32 blocks, whose rows must not
/// depend on the block), else [`masked_attention`].
pub fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    span: AttentionSpan<'_>,
    exact: bool,
) -> candle_core::Result<Tensor> {
    if exact {
        exact_attention(q, k, v, span)
    } else {
        masked_attention(q, k, v, span)
    }
}

/// [`attend`] through candle's batched matmuls with an additive mask (GPUs, long prefill
/// chunks); scores and softmax in f32 whatever the activations' dtype.
pub fn masked_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    span: AttentionSpan<'_>,
) -> candle_core::Result<Tensor> {
    let (t, hq, d) = q.dims3()?;
    let (hkv, s, _) = k.dims3()?;
    if hkv == 0 || !hq.is_multiple_of(hkv) {
        candle_core::bail!("attention: {hq} query heads do not share {hkv} K/V heads evenly");
    }
    let group = hq / hkv;
    // [hq, t, d] viewed as [hkv, group * t, d]: the query heads of one KV head together, so
    // the K/V rows are read as they are, never copied per query head.
    let q = q
        .transpose(0, 1)?
        .contiguous()?
        .reshape((hkv, group * t, d))?;
    let scores = (q.matmul(&k.contiguous()?.t()?)? * f64::from(span.scale))?;
    let mask = span.mask(t, s).repeat(group);
    let mask = Tensor::from_vec(mask, (1, group * t, s), q.device())?.to_dtype(scores.dtype())?;
    let scores = scores.broadcast_add(&mask)?.to_dtype(DType::F32)?;
    let probs = candle_nn::ops::softmax_last_dim(&scores)?.to_dtype(v.dtype())?;
    probs
        .matmul(&v.contiguous()?)?
        .reshape((hq, t, d))?
        .transpose(0, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::TreeQueries;
    use crate::test_rng::Lcg;
    use candle_core::Device;

    /// Values in [-0.5, 0.5).
    fn random(shape: (usize, usize, usize), seed: u64) -> Tensor {
        let mut rng = Lcg(seed);
        let values: Vec<f32> = (0..shape.0 * shape.1 * shape.2)
            .map(|_| rng.next() * 0.5)
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    #[test]
    fn the_masked_path_agrees_with_the_exact_kernels() {
        // Four query heads over two K/V heads; a window, a key offset and a tree.
        let parents = [0u32, 1, 0];
        let tree = TreeQueries::new(&parents, 4, 6);
        let spans = [
            AttentionSpan {
                query_start: 6,
                key_start: 0,
                window: None,
                scale: 0.125,
                tree: None,
            },
            AttentionSpan {
                query_start: 6,
                key_start: 2,
                window: Some(5),
                scale: 1.0,
                tree: None,
            },
            AttentionSpan {
                query_start: 6,
                key_start: 0,
                window: None,
                scale: 1.0,
                tree: Some(&tree),
            },
        ];
        for (i, span) in spans.into_iter().enumerate() {
            let keys = 10 - span.key_start;
            let q = random((4, 4, 8), i as u64);
            let k = random((2, keys, 8), 10 + i as u64);
            let v = random((2, keys, 8), 20 + i as u64);
            let exact = attend(&q, &k, &v, span, true).unwrap();
            let masked = attend(&q, &k, &v, span, false).unwrap();
            assert_eq!(masked.dims(), &[4, 4, 8]);
            let diff = max_diff(&exact, &masked);
            assert!(diff < 1e-5, "span {i}: exact and masked differ by {diff}");
        }
    }

    #[test]
    fn heads_that_do_not_share_kv_heads_evenly_are_refused() {
        let q = random((1, 3, 4), 1);
        let k = random((2, 2, 4), 2);
        let span = AttentionSpan {
            query_start: 1,
            key_start: 0,
            window: None,
            scale: 1.0,
            tree: None,
        };
        let err = masked_attention(&q, &k, &k, span).unwrap_err().to_string();
        assert!(err.contains("3 query heads"), "{err}");
    }
}
