//! What one generation asks for.

use crate::block_size::BlockSizeConfig;
use crate::ids::{SeqId, SessionId};
use crate::prefix_cache::CacheScope;
use crate::sampling::{
    LogitRuleError, LogitRules, SamplingParamError, SamplingParams, MAX_TOP_LOGPROBS,
};
use crate::stop::{StopConditionError, StopConditions};

/// One request for the round loop.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationRequest {
    /// Verifier sequence to create; unique among live requests.
    pub seq: SeqId,
    /// Drafter session to create; unique among live requests.
    pub session: SessionId,
    /// Prompt token ids (not empty).
    pub prompt_ids: Vec<u32>,
    /// How the target picks tokens.
    pub sampling: SamplingParams,
    /// When to stop.
    pub stop: StopConditions,
    /// Verify width; 1 disables speculation.
    pub block_size: BlockSizeConfig,
    /// Which cached prompt prefixes the request may reuse (its tenant's).
    pub cache_scope: CacheScope,
    /// Bias, penalties and min-p.
    pub rules: LogitRules,
    /// Report every token's log probability with this many alternatives.
    pub top_logprobs: Option<u32>,
    /// Most drafts per round taken from what an output constraint forces (0: none): they
    /// cost no drafter call, only verify rows.
    pub forced_drafts: usize,
}

impl GenerationRequest {
    /// Checks every field; the error names the offending one.
    pub fn validate(&self) -> Result<(), RequestError> {
        if self.prompt_ids.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        self.sampling.validate()?;
        self.rules.validate(None)?;
        if let Some(top) = self.top_logprobs.filter(|&top| top > MAX_TOP_LOGPROBS) {
            return Err(RequestError::TopLogprobs(top));
        }
        self.stop.validate()?;
        Ok(())
    }
}

/// A request field is invalid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The prompt has no tokens.
    #[error("invalid request `prompt_ids`: must not be empty")]
    EmptyPrompt,
    /// A sampling parameter is out of range.
    #[error(transparent)]
    Sampling(#[from] SamplingParamError),
    /// A stop condition is out of range.
    #[error(transparent)]
    Stop(#[from] StopConditionError),
    /// A logit rule is out of range.
    #[error(transparent)]
    Rules(#[from] LogitRuleError),
    /// More alternatives than a token may report.
    #[error("invalid request `top_logprobs`: at most {MAX_TOP_LOGPROBS}, got {0}")]
    TopLogprobs(u32),
}

impl RequestError {
    /// Name of the offending field.
    pub fn field(&self) -> &str {
        match self {
            RequestError::EmptyPrompt => "prompt_ids",
            RequestError::Sampling(e) => e.field,
            RequestError::Stop(e) => &e.field,
            RequestError::Rules(e) => e.field,
            RequestError::TopLogprobs(_) => "top_logprobs",
        }
    }
}
