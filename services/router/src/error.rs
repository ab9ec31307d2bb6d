//! Failures of the router's remote calls.

use tonic::{Code, Status};

/// A call to the verifier or a drafter failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The service answered with an error status.
    #[error("{service}: {status}")]
    Status {
        service: &'static str,
        status: Status,
    },
    /// The service's answer breaks the protocol.
    #[error("{service}: protocol violation: {reason}")]
    Protocol {
        service: &'static str,
        reason: String,
    },
}

impl RemoteError {
    pub(crate) fn verifier(status: Status) -> Self {
        Self::Status {
            service: "verifier",
            status,
        }
    }

    pub(crate) fn drafter(status: Status) -> Self {
        Self::Status {
            service: "drafter",
            status,
        }
    }

    pub(crate) fn protocol(service: &'static str, reason: impl Into<String>) -> Self {
        Self::Protocol {
            service,
            reason: reason.into(),
        }
    }

    /// The status code a service answered with; `None` for protocol violations.
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Status { status, .. } => Some(status.code()),
            Self::Protocol { .. } => None,
        }
    }

    /// The status to answer the public client with: a service's own status keeps its code
    /// (an out-of-room verifier stays RESOURCE_EXHAUSTED), anything else is INTERNAL.
    pub fn to_status(&self) -> Status {
        match self {
            Self::Status { service, status } => {
                Status::new(status.code(), format!("{service}: {}", status.message()))
            }
            Self::Protocol { .. } => Status::internal(self.to_string()),
        }
    }
}
