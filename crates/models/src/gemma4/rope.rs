//! Rotary angles of Gemma 4: default RoPE on sliding layers and "proportional" RoPE on full
//! layers, where only the first `partial_rotary_factor` of each half rotates and the
//! exponent still divides by the whole head dimension.

use super::config::{Gemma4TextConfig, LayerKind, RopeConfig};
use crate::blocks::rope::RotaryTable;

/// The angles of `cfg` for heads of `head_dim`, in f32 as transformers computes them.
pub fn table(cfg: &RopeConfig, head_dim: usize) -> RotaryTable {
    let half = head_dim / 2;
    let rotated = if cfg.proportional {
        ((cfg.partial_rotary_factor * head_dim as f64) as usize / 2).min(half)
    } else {
        half
    };
    let theta = cfg.theta as f32;
    let factor = cfg.factor as f32;
    RotaryTable::F32(
        (0..half)
            .map(|i| {
                if i < rotated {
                    let exponent = (2 * i) as f32 / head_dim as f32;
                    (1.0 / theta.powf(exponent)) / factor
                } else {
                    0.0
                }
            })
            .collect(),
    )
}

/// One table per (layer kind, head dim) the layers of `cfg` use, in first-use order.
pub fn tables_by_layer(cfg: &Gemma4TextConfig) -> Vec<((LayerKind, usize), RotaryTable)> {
    let mut tables: Vec<((LayerKind, usize), RotaryTable)> = Vec::new();
    for l in &cfg.layers {
        let key = (l.kind, l.head_dim);
        if !tables.iter().any(|(k, _)| *k == key) {
            tables.push((key, table(cfg.rope_for(l.kind), l.head_dim)));
        }
    }
    tables
}
