//! Which prefix of a cached sequence a new sequence may start from, and who may share it.

/// How much of a cached state a new sequence may reuse so that it computes, bit for bit,
/// what a cold prefill of its prompt would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixRule {
    /// The model's state cannot be reused.
    Never,
    /// Every position is computed the same whatever the rows beside it (a row-invariant
    /// engine: any prefill chunking, verify block or decoding step gives the same bits), so
    /// any common prefix is reusable.
    AnyLength,
    /// Positions are the same only when computed by the same prefill chunks: a new sequence
    /// may start only at a multiple of the chunk, within the part of the cached sequence
    /// that its own prefill computed (rows computed by decoding rounds differ).
    PrefillChunks(usize),
}

impl PrefixRule {
    /// Positions a new prompt of `prompt_len` tokens may take from a state sharing `common`
    /// tokens with it, whose first `prefilled` positions came from a prefill. At least one
    /// prompt token is always left to compute (its hidden state samples the first token).
    pub fn usable(self, common: usize, prefilled: usize, prompt_len: usize) -> usize {
        let most = common.min(prompt_len.saturating_sub(1));
        match self {
            PrefixRule::Never => 0,
            PrefixRule::AnyLength => most,
            PrefixRule::PrefillChunks(chunk) => {
                let chunk = chunk.max(1);
                most.min(prefilled) / chunk * chunk
            }
        }
    }
}

/// Who may reuse a cached prefix: only requests of the same scope do, so that a cached
/// prompt does not leak across tenants through time to first token. The empty scope is
/// shared by every request that has none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CacheScope(pub String);

impl CacheScope {
    /// The scope every request without one shares.
    pub fn global() -> Self {
        Self::default()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}
