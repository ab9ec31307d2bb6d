//! Errors in the OpenAI error shape: `{"error": {"message", "type", "param", "code"}}`, with
//! the HTTP status an OpenAI client expects.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tonic::{Code, Status};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
}

impl ApiError {
    /// A bad request naming `field`.
    pub fn field(field: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        let field = field.into();
        Self {
            status: StatusCode::BAD_REQUEST,
            message: format!("{field}: {reason}"),
            param: Some(field),
        }
    }

    /// A `model` this server does not serve (404, as OpenAI answers).
    pub fn unknown_model(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            param: Some("model".into()),
        }
    }

    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }

    /// The OpenAI error `type` for this status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => "invalid_request_error",
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => "invalid_request_error",
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => "authentication_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
            StatusCode::GATEWAY_TIMEOUT => "timeout",
            _ => "server_error",
        }
    }

    /// The body: also what a stream sends as its last event when a request fails midway.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }
}

impl From<Status> for ApiError {
    fn from(status: Status) -> Self {
        let http = match status.code() {
            Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
                StatusCode::BAD_REQUEST
            }
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = status.message().to_owned();
        let param = (http == StatusCode::BAD_REQUEST)
            .then(|| field_of(&message))
            .flatten();
        Self {
            status: http,
            message,
            param,
        }
    }
}

/// The field a validation message starts with (`max_tokens: ...`, `messages[0].role: ...`).
fn field_of(message: &str) -> Option<String> {
    let (head, _) = message.split_once(": ")?;
    let is_path = !head.is_empty()
        && head
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']'));
    is_path.then(|| head.to_owned())
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        super::json_response(self.status, &self.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_openai_codes_and_name_the_field() {
        let bad = ApiError::from(Status::invalid_argument("max_tokens: must be at least 1"));
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
        assert_eq!(bad.param.as_deref(), Some("max_tokens"));
        assert_eq!(bad.body()["error"]["type"], "invalid_request_error");
        let full = ApiError::from(Status::resource_exhausted("busy"));
        assert_eq!(full.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(full.param, None);
        let gone = ApiError::from(Status::unavailable("draining"));
        assert_eq!(gone.status, StatusCode::SERVICE_UNAVAILABLE);
        let nested = ApiError::from(Status::invalid_argument(
            "messages[2].role: must not be empty",
        ));
        assert_eq!(nested.param.as_deref(), Some("messages[2].role"));
        let prose = ApiError::from(Status::invalid_argument("the prompt is bad: x"));
        assert_eq!(prose.param, None);
    }
}
