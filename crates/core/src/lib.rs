//! Model-free speculative decoding logic for specd.
//!
//! * [`sampling`]: the stateless keyed sampler shared by plain decoding and verification.
//! * [`acceptance`]: the acceptance walk over a verified block.
//! * [`block_size`]: how many tokens each round verifies, decided by one [`BlockPlanner`].
//! * [`stats`]: per-request speculative statistics.
//! * [`stop`]: stop conditions and incremental text output.
//! * [`verifier`] and [`drafter`]: the two sides of a round, as async traits.
//! * [`constraint`]: what a grammar must tell the round loop to constrain a request.
//! * [`round_loop`]: the per-request state machine that drives them.
//! * [`ngram`]: the model-free prompt-lookup drafter.
//! * [`hybrid`]: prompt lookup in front of another drafter, for rounds that copy.
#![forbid(unsafe_code)]

pub mod acceptance;
pub mod block_size;
pub mod constraint;
pub mod drafter;
pub mod fallback;
pub mod finish;
pub mod hybrid;
pub mod ids;
pub mod metric_names;
pub mod ngram;
#[cfg(test)]
mod poll_once;
pub mod prefix_cache;
pub mod round_loop;
pub mod sampling;
pub mod stats;
pub mod stop;
pub mod sync;
pub mod tree;
pub mod verifier;

pub use acceptance::{accept_drafts, accept_with_targets, Accepted};
pub use block_size::{
    load_block_cap, BlockPlanner, BlockSizeConfig, BlockSizeController, GovernedRound, OpenCost,
    SpeculationGovernor,
};
pub use constraint::{BlockMasks, ConstraintError, TokenConstraint};
pub use drafter::{DraftRequest, Drafter, NoDrafter, OpenRequest, Opened};
pub use fallback::{DrafterFallback, FallbackCause};
pub use finish::FinishReason;
pub use hybrid::HybridDrafter;
pub use ids::{SeqId, SessionId};
pub use ngram::{NgramConfig, NgramDrafter};
pub use prefix_cache::{CacheScope, PrefixCache, PrefixRule};
pub use round_loop::{
    Event, EventSink, Finish, GenerationRequest, RequestControl, RoundLoop, RoundLoopError,
    TokenDelta,
};
pub use sampling::{sample, LogitRules, SamplingParams, TokenLogprob, TokenMask};
pub use stats::SpecStats;
pub use stop::{Detokenizer, StopConditions};
pub use tree::{accept_tree, DraftTree};
pub use verifier::{ForwardCost, PrefillRequest, Prefilled, Verified, Verifier, VerifyRequest};
