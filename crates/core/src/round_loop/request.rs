//! What one generation asks for.

use crate::block_size::BlockSizeConfig;
use crate::ids::{SeqId, SessionId};
use crate::prefix_cache::CacheScope;
use crate::sampling::{SamplingParamError, SamplingParams};
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
}

impl GenerationRequest {
    /// Checks every field; the error names the offending one.
    pub fn validate(&self) -> Result<(), RequestError> {
        if self.prompt_ids.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        self.sampling.validate()?;
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
}

impl RequestError {
    /// Name of the offending field.
    pub fn field(&self) -> &str {
        match self {
            RequestError::EmptyPrompt => "prompt_ids",
            RequestError::Sampling(e) => e.field,
            RequestError::Stop(e) => &e.field,
        }
    }
}
