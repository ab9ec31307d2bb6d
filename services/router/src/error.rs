//! Failures of the router's remote calls.

use tonic::{Code, Status};
use tracing::warn;

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

    /// The status to answer the public client with. A service that could not be reached,
    /// failed mid-call or lost the request's state is UNAVAILABLE (the client may retry);
    /// an internal failure is INTERNAL; neither passes on the service's own text (transport
    /// details, addresses), which goes to the log instead. A service's answer about the
    /// request itself keeps its code and message (an out-of-room verifier stays
    /// RESOURCE_EXHAUSTED).
    pub fn to_status(&self) -> Status {
        match self {
            Self::Status { service, status } => {
                let code = status.code();
                match code {
                    Code::Unknown
                    | Code::Unavailable
                    | Code::Cancelled
                    | Code::NotFound
                    | Code::Aborted
                    | Code::Internal
                    | Code::DataLoss => {
                        warn!(
                            service,
                            ?code,
                            detail = status.message(),
                            "remote call failed"
                        );
                    }
                    _ => {}
                }
                match code {
                    Code::Unknown
                    | Code::Unavailable
                    | Code::Cancelled
                    | Code::NotFound
                    | Code::Aborted => Status::unavailable(format!(
                        "{service}: unavailable: the service failed or lost the request's \
                         state; retry the request"
                    )),
                    Code::Internal | Code::DataLoss => {
                        Status::internal(format!("{service}: internal error"))
                    }
                    _ => Status::new(code, format!("{service}: {}", status.message())),
                }
            }
            Self::Protocol { .. } => Status::internal(self.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_services_are_unavailable_without_their_transport_text() {
        for code in [
            Code::Unknown,
            Code::Unavailable,
            Code::NotFound,
            Code::Aborted,
        ] {
            let status = RemoteError::verifier(Status::new(
                code,
                "transport error: connection refused (10.0.0.7:50051)",
            ))
            .to_status();
            assert_eq!(status.code(), Code::Unavailable, "{code:?}");
            assert!(
                status.message().starts_with("verifier: unavailable"),
                "{status}"
            );
            assert!(!status.message().contains("10.0.0.7"), "{status}");
        }
        let internal =
            RemoteError::drafter(Status::internal("h2 protocol error: frame size")).to_status();
        assert_eq!(internal.code(), Code::Internal);
        assert!(!internal.message().contains("h2"), "{internal}");
    }

    #[test]
    fn answers_about_the_request_keep_code_and_message() {
        let full = RemoteError::verifier(Status::resource_exhausted("kv budget: full")).to_status();
        assert_eq!(full.code(), Code::ResourceExhausted);
        assert_eq!(full.message(), "verifier: kv budget: full");
    }
}
