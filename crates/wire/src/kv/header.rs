//! Validation of a snapshot header: the layouts the data chunks must fill.

use super::error::{inconsistent, KvWireError};
use super::POSITION_AXIS;
use crate::tensor::TensorLayout;
use crate::{KvPart, SnapshotHeader, TensorSpec};

/// One mirrored tensor of a snapshot, in stream order.
#[derive(Debug, Clone)]
pub(crate) struct PartLayout {
    pub part: KvPart,
    pub layout: TensorLayout,
}

/// A header whose tensors agree with each other and with the committed length.
#[derive(Debug, Clone)]
pub(crate) struct HeaderLayout {
    pub committed_len: u32,
    pub sliding_start: u32,
    /// full_k, full_v, then sliding_k, sliding_v when present.
    pub parts: Vec<PartLayout>,
}

impl HeaderLayout {
    pub fn parse(header: &SnapshotHeader, field: &str) -> Result<Self, KvWireError> {
        let committed = header.committed_len as usize;
        let full_k = required_spec(header.full_k.as_ref(), &format!("{field}.full_k"))?;
        let full_v = required_spec(header.full_v.as_ref(), &format!("{field}.full_v"))?;
        check_pair(field, "full", &full_k, &full_v, Some(committed))?;
        let mut parts = vec![
            PartLayout {
                part: KvPart::FullK,
                layout: full_k,
            },
            PartLayout {
                part: KvPart::FullV,
                layout: full_v,
            },
        ];

        match (&header.sliding_k, &header.sliding_v) {
            (None, None) => {
                if header.sliding_start != 0 {
                    return Err(inconsistent(
                        &format!("{field}.sliding_start"),
                        format!(
                            "must be 0 without sliding tensors, got {}",
                            header.sliding_start
                        ),
                    ));
                }
            }
            (Some(k), Some(v)) => {
                if header.sliding_start > header.committed_len {
                    return Err(inconsistent(
                        &format!("{field}.sliding_start"),
                        format!(
                            "{} is past committed_len {}",
                            header.sliding_start, header.committed_len
                        ),
                    ));
                }
                let rows = (header.committed_len - header.sliding_start) as usize;
                let k = spec_layout(k, &format!("{field}.sliding_k"))?;
                let v = spec_layout(v, &format!("{field}.sliding_v"))?;
                check_pair(field, "sliding", &k, &v, Some(rows))?;
                parts.push(PartLayout {
                    part: KvPart::SlidingK,
                    layout: k,
                });
                parts.push(PartLayout {
                    part: KvPart::SlidingV,
                    layout: v,
                });
            }
            _ => {
                return Err(inconsistent(
                    field,
                    "sliding_k and sliding_v must be both set or both unset",
                ))
            }
        }
        Ok(Self {
            committed_len: header.committed_len,
            sliding_start: header.sliding_start,
            parts,
        })
    }

    /// Bytes the data chunks must deliver, saturating at `usize::MAX`.
    pub fn total_bytes(&self) -> usize {
        self.parts
            .iter()
            .fold(0usize, |sum, p| sum.saturating_add(p.layout.byte_len()))
    }
}

/// The field name of a mirrored tensor, as in `SnapshotHeader` and `KvDelta`.
pub(crate) fn part_name(part: KvPart) -> &'static str {
    match part {
        KvPart::Unspecified => "unspecified",
        KvPart::FullK => "full_k",
        KvPart::FullV => "full_v",
        KvPart::SlidingK => "sliding_k",
        KvPart::SlidingV => "sliding_v",
    }
}

/// Checks that a layer's K and V have the layout `[1, kv_heads, rows, head_dim]` with the same
/// batch, heads and rows, and (when given) `rows` positions. Returns the row count.
pub(crate) fn check_pair(
    field: &str,
    layer: &str,
    k: &TensorLayout,
    v: &TensorLayout,
    rows: Option<usize>,
) -> Result<usize, KvWireError> {
    for (name, layout) in [("k", k), ("v", v)] {
        let dims = layout.dims();
        if dims.len() != 4 || dims[0] != 1 {
            return Err(inconsistent(
                &format!("{field}.{layer}_{name}.shape"),
                format!("expected [1,kv_heads,positions,head_dim], got {layout}"),
            ));
        }
    }
    if k.dims()[..3] != v.dims()[..3] {
        return Err(inconsistent(
            &format!("{field}.{layer}_v.shape"),
            format!("{v} does not match {layer}_k {k} in batch, heads or positions"),
        ));
    }
    let got = k.dims()[POSITION_AXIS];
    if let Some(rows) = rows {
        if got != rows {
            return Err(inconsistent(
                &format!("{field}.{layer}_k.shape"),
                format!("expected {rows} positions on axis {POSITION_AXIS}, got {k}"),
            ));
        }
    }
    Ok(got)
}

fn required_spec(spec: Option<&TensorSpec>, field: &str) -> Result<TensorLayout, KvWireError> {
    match spec {
        Some(spec) => spec_layout(spec, field),
        None => Err(crate::tensor::TensorCodecError::Missing {
            field: field.to_owned(),
        }
        .into()),
    }
}

fn spec_layout(spec: &TensorSpec, field: &str) -> Result<TensorLayout, KvWireError> {
    Ok(TensorLayout::parse(field, &spec.dtype, &spec.shape)?)
}
