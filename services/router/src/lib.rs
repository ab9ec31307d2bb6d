//! The router side of specd: the public `specd.v1.Generation` service.
//!
//! Each request runs one core round loop ([`specd_core::RoundLoop`]) against the verifier
//! service ([`remote_verifier::RemoteSequence`]) and a drafter: a drafter service
//! ([`remote_drafter::RemoteSession`]), the in-process n-gram drafter, or none. The router
//! forwards the verifier's hidden states and K/V to MTP drafters in wire form and never runs
//! a model itself; its only model files are the target's tokenizer and config.
//!
//! Cancellation: a unary client that cancels drops the request future, a streaming client
//! that goes away drops it too; either way the round loop's guard releases the verifier
//! sequence and closes the drafter session in the background.

#![forbid(unsafe_code)]

mod admission;
pub mod affinity;
pub mod auth;
pub mod cache_scope;
pub mod carry;
mod client_telemetry;
pub mod config;
pub mod deadline;
mod detached;
mod discovery;
pub mod drafters;
pub mod error;
mod http;
pub mod in_process;
mod output_format;
pub mod overlap;
mod pool_member;
pub mod predraft;
pub mod remote_drafter;
pub mod remote_verifier;
mod report;
pub mod request_limits;
mod run;
pub mod sampling;
mod serve;
mod service;
mod session_resume;
mod sink;
pub mod upstream;
pub mod validate;
pub mod verifiers;

pub use auth::ApiKeys;
pub use cache_scope::PrefixCacheScope;
pub use config::{RouterConfig, TargetLimits};
pub use drafters::{DraftSource, DrafterDns};
pub use http::serve_http;
pub use in_process::{ChannelSink, EngineRun, EventSender, InProcessEngine};
pub use request_limits::RequestLimits;
pub use serve::{serve, ServeError};
pub use service::{GenerationService, RouterSetupError};
pub use specd_text::TargetText;
pub use upstream::Upstream;
pub use verifiers::{VerifierDns, VerifierSource};
