//! Transformer blocks the families share: rotary position tables and their rotation, and the
//! attention of a block of queries over cached K/V, on candle's tensors (the path for GPUs
//! and for long prefill chunks) or on the row-exact kernels.
//!
//! A family keeps what is its own (how its angles are derived, its norms' formula, its
//! projections' names); what is the same computation lives here once.

pub(crate) mod attention;
pub(crate) mod rope;
