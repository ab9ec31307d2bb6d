//! The specd protocol: generated gRPC types behind curated re-exports, the tensor codec,
//! the shared-K/V transfer codecs, message-size limits and server plumbing (health and
//! reflection).
//!
//! Generated code lives in a private module; the rest of the workspace names types only
//! through this crate's modules:
//! - [`generation`]: the public `specd.v1.Generation` service and its messages;
//! - [`verifier`]: the internal `specd.v1.Verifier` service;
//! - [`drafter`]: the internal `specd.v1.Drafter` service;
//! - messages shared by several services at the crate root ([`WireTensor`], [`KvDelta`],
//!   [`SnapshotChunk`], [`Sampling`], ...).

#![forbid(unsafe_code)]

mod pb {
    #![allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    include!(concat!(env!("OUT_DIR"), "/specd.v1.rs"));
}

pub mod descriptor;
pub mod draining;
pub mod health;
pub mod idle;
pub mod ids;
pub mod kv;
pub mod limits;
pub mod placement;
pub mod sampling;
pub mod serving;
pub mod tensor;
pub mod tls;

/// `specd.v1.Tensor`: the wire form of a tensor (see [`tensor`] for the candle codec).
pub use pb::Tensor as WireTensor;
pub use pb::{
    snapshot_chunk, KvDelta, KvPart, LogitRules, Sampling, SnapshotChunk, SnapshotData,
    SnapshotHeader, TensorSpec, TokenLogprob, TopLogprob,
};

/// The public `specd.v1.Generation` service (served by the router).
pub mod generation {
    pub use crate::pb::chat_message;
    pub use crate::pb::generate_request;
    pub use crate::pb::generation_client::GenerationClient;
    pub use crate::pb::generation_server::{
        Generation, GenerationServer, SERVICE_NAME as GENERATION_SERVICE_NAME,
    };
    pub use crate::pb::output_constraint;
    pub use crate::pb::{
        ChatMessage, ChatMessages, FinishReason, GenerateRequest, GenerateResponse,
        GenerateStreamResponse, GenerationStats, OutputConstraint, SamplingParams,
        SpeculativeParams, TokenIds,
    };
    pub use crate::pb::{TokenLogprob, TopLogprob};
}

/// The internal `specd.v1.Verifier` service (the target model).
pub mod verifier {
    pub use crate::pb::prefill_response;
    pub use crate::pb::verifier_client::VerifierClient;
    pub use crate::pb::verifier_server::{
        Verifier, VerifierServer, SERVICE_NAME as VERIFIER_SERVICE_NAME,
    };
    pub use crate::pb::{
        ForwardStats, PrefillHead, PrefillRequest, PrefillResponse, ReleaseRequest,
        ReleaseResponse, SnapshotRequest, TruncateRequest, TruncateResponse, VerifierStatsRequest,
        VerifierStatsResponse, VerifyRequest, VerifyResponse,
    };
}

/// The internal `specd.v1.Drafter` service.
pub mod drafter {
    pub use crate::pb::drafter_client::DrafterClient;
    pub use crate::pb::drafter_server::{
        Drafter, DrafterServer, SERVICE_NAME as DRAFTER_SERVICE_NAME,
    };
    pub use crate::pb::{draft_request, open_request};
    pub use crate::pb::{
        CloseRequest, CloseResponse, DraftRequest, DraftResponse, DrafterKind, DrafterStatsRequest,
        DrafterStatsResponse, MtpCarry, OpenHeader, OpenRequest, OpenResponse, TokenCarry,
    };
}
