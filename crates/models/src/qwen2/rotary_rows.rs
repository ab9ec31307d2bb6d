//! Q/K rows of a file that pairs rotary dimensions adjacently ([`RotaryPairs::Adjacent`]),
//! put back in halves order, which the engine's and candle's rotary embeddings rotate.
//!
//! llama.cpp's converter stores head row `s * head_dim / 2 + i` of a checkpoint (`s` in 0..2)
//! at `2i + s`, so that its normal rope, which rotates rows `2i` and `2i + 1` together,
//! rotates what `rotate_half` rotates. Undoing that at load keeps one rotary embedding for
//! every architecture, and the attention scores are those of the checkpoint.
//!
//! [`RotaryPairs::Adjacent`]: super::config::RotaryPairs::Adjacent

use super::error::{Qwen2Error, Result};

/// `rows` (whole heads of `head_dim` rows, each `row_len` elements) in halves order.
pub(crate) fn halves_from_adjacent<T: Copy>(
    name: &str,
    rows: &[T],
    head_dim: usize,
    row_len: usize,
) -> Result<Vec<T>> {
    let head_len = head_dim * row_len;
    if !head_dim.is_multiple_of(2) || head_len == 0 || !rows.len().is_multiple_of(head_len) {
        return Err(Qwen2Error::field(
            name,
            format!(
                "{} elements are not whole heads of {head_dim} rows of {row_len}",
                rows.len()
            ),
        ));
    }
    let half = head_dim / 2;
    let mut out = Vec::with_capacity(rows.len());
    for head in rows.chunks_exact(head_len) {
        for s in 0..2 {
            for i in 0..half {
                let from = (2 * i + s) * row_len;
                out.extend_from_slice(&head[from..from + row_len]);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's `permute`: reshape `(heads, 2, half, ..)`, swap the two middle axes.
    fn adjacent_from_halves(rows: &[u32], head_dim: usize) -> Vec<u32> {
        let half = head_dim / 2;
        let mut out = vec![0; rows.len()];
        for (h, head) in rows.chunks_exact(head_dim).enumerate() {
            for s in 0..2 {
                for i in 0..half {
                    out[h * head_dim + 2 * i + s] = head[s * half + i];
                }
            }
        }
        out
    }

    #[test]
    fn undoes_the_converter_permutation_row_by_row() {
        let rows: Vec<u32> = (0..24).collect();
        let stored = adjacent_from_halves(&rows, 6);
        assert_eq!(&stored[..6], &[0, 3, 1, 4, 2, 5]);
        assert_eq!(halves_from_adjacent("q", &stored, 6, 1).unwrap(), rows);
        // Rows of several elements move whole.
        let wide: Vec<u32> = stored.iter().flat_map(|&r| [r * 10, r * 10 + 1]).collect();
        let back = halves_from_adjacent("q", &wide, 6, 2).unwrap();
        let expected: Vec<u32> = rows.iter().flat_map(|&r| [r * 10, r * 10 + 1]).collect();
        assert_eq!(back, expected);
    }

    #[test]
    fn partial_heads_are_refused_naming_the_tensor() {
        let err = halves_from_adjacent("blk.0.attn_k.weight", &[0u8; 10], 4, 2).unwrap_err();
        assert!(err.to_string().contains("blk.0.attn_k.weight"), "{err}");
    }
}
