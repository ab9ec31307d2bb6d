//! Client deadlines: read from the public request's `grpc-timeout`, carried on every call the
//! router makes for it.

use std::time::{Duration, Instant};

use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

/// Answered this much before the client's own deadline, so that the client learns
/// DEADLINE_EXCEEDED from the router rather than a transport timeout racing it.
const ANSWER_LEAD: Duration = Duration::from_millis(20);

/// The instant a request must be answered by, from its `grpc-timeout` header; `None`
/// without one. A malformed header is INVALID_ARGUMENT.
pub fn request_deadline(metadata: &MetadataMap, now: Instant) -> Result<Option<Instant>, Status> {
    let Some(value) = metadata.get("grpc-timeout") else {
        return Ok(None);
    };
    let timeout = value
        .to_str()
        .ok()
        .and_then(parse_grpc_timeout)
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "grpc-timeout: expected 1 to 8 digits and a unit (H, M, S, m, u, n), got {value:?}"
            ))
        })?;
    Ok(Some(now + timeout.saturating_sub(ANSWER_LEAD)))
}

/// Parses a gRPC timeout value: up to 8 ASCII digits, then one unit letter.
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// `message` as a request carrying the time left until `deadline`; DEADLINE_EXCEEDED when
/// none is left.
pub fn with_deadline<T>(message: T, deadline: Option<Instant>) -> Result<Request<T>, Status> {
    // The current span's trace context rides along, so the callee continues the trace.
    let mut request = specd_telemetry::propagation::traced(message);
    if let Some(deadline) = deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Status::deadline_exceeded("the request's deadline passed"));
        }
        request.set_timeout(left);
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_in_every_unit() {
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("9n"), Some(Duration::from_nanos(9)));
    }

    #[test]
    fn malformed_timeouts_are_refused() {
        for bad in ["", "S", "5", "5s", "123456789S", "-5S", "5 S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_bad_header_names_the_field() {
        let mut metadata = MetadataMap::new();
        metadata.insert("grpc-timeout", "soon".parse().unwrap());
        let status = request_deadline(&metadata, Instant::now()).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with("grpc-timeout"));
    }

    #[test]
    fn a_passed_deadline_is_deadline_exceeded() {
        let status = with_deadline((), Some(Instant::now())).unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        let request = with_deadline((), Some(Instant::now() + Duration::from_secs(5))).unwrap();
        assert!(request.metadata().get("grpc-timeout").is_some());
    }
}
