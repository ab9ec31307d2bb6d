//! W3C trace context in gRPC metadata: injected on every outgoing call, extracted by every
//! server, so that one request is one trace across router, drafters and verifier.

use opentelemetry::propagation::{Extractor, Injector};
pub use opentelemetry::trace::SpanContext;
use opentelemetry::trace::TraceContextExt;
use tonic::metadata::{Ascii, MetadataKey, MetadataMap, MetadataValue};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Services whose calls are not part of any request (probes, discovery).
const UNTRACED_SERVICES: &[&str] = &[
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
];

/// `message` as a request carrying the current span's trace context.
pub fn traced<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    inject(request.metadata_mut());
    request
}

/// Writes the current span's trace context (`traceparent`, `tracestate`) into `metadata`.
pub fn inject(metadata: &mut MetadataMap) {
    let context = Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut MetadataInjector(metadata));
    });
}

/// The server span of one gRPC call, child of the caller's span when the call carries trace
/// context. Use as `Server::builder().trace_fn(server_span)`. The span is named after the
/// method in lower case (`verify`, `draft`, ...), so client and server spans pair up.
pub fn server_span(request: &http::Request<()>) -> Span {
    let path = request.uri().path();
    let (service, method) = split_path(path);
    if UNTRACED_SERVICES.contains(&service) {
        return Span::none();
    }
    let name = method.to_ascii_lowercase();
    let span = tracing::info_span!(
        "rpc",
        otel.name = %name,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = %service,
        rpc.method = %method,
    );
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderExtractor(request.headers()))
    });
    if parent.span().span_context().is_valid() {
        // Right after creation, before anything enters the span or reads its context.
        if let Err(error) = span.set_parent(parent) {
            tracing::debug!(%error, "could not attach the caller's trace context");
        }
    }
    span
}

/// The server span of one HTTP request (the router's OpenAI-compatible API), named after its
/// route, child of the caller's span when the request carries W3C trace context.
pub fn http_server_span(method: &http::Method, route: &str, headers: &http::HeaderMap) -> Span {
    let span = tracing::info_span!(
        "http",
        otel.name = %format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
    );
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderExtractor(headers))
    });
    if parent.span().span_context().is_valid() {
        if let Err(error) = span.set_parent(parent) {
            tracing::debug!(%error, "could not attach the caller's trace context");
        }
    }
    span
}

/// The span context of the current span: what a batched row keeps so the batch's span can
/// link back to the round that sent it. Invalid when tracing is off.
pub fn current_span_context() -> SpanContext {
    Span::current().context().span().span_context().clone()
}

/// Links `span` (a batched forward) to the span of one row it serves.
pub fn link_row(span: &Span, row: &SpanContext) {
    if row.is_valid() {
        span.add_link(row.clone());
    }
}

/// Sets an attribute on the current span, e.g. counts known only inside a handler.
pub fn set_current_attribute(key: &'static str, value: i64) {
    Span::current().set_attribute(key, value);
}

fn split_path(path: &str) -> (&str, &str) {
    let trimmed = path.trim_start_matches('/');
    trimmed.split_once('/').unwrap_or((trimmed, ""))
}

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let Ok(key) = MetadataKey::<Ascii>::from_bytes(key.as_bytes()) else {
            return;
        };
        if let Ok(value) = MetadataValue::try_from(value.as_str()) {
            self.0.insert(key, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::layer::SubscriberExt;

    const TRACE_ID: &str = "4bf92f3577b34a4d8e4f1a2b3c4d5e6f";

    fn subscriber() -> impl tracing::Subscriber + Send + Sync {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let provider = SdkTracerProvider::builder().build();
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
    }

    #[test]
    fn server_span_continues_the_callers_trace_and_injects_it_onward() {
        tracing::subscriber::with_default(subscriber(), || {
            let request = http::Request::builder()
                .uri("/specd.v1.Verifier/Verify")
                .header("traceparent", format!("00-{TRACE_ID}-00f067aa0ba902b7-01"))
                .body(())
                .unwrap();
            let span = server_span(&request);
            let _entered = span.enter();
            let onward = traced(());
            let header = onward
                .metadata()
                .get("traceparent")
                .unwrap()
                .to_str()
                .unwrap();
            assert!(header.starts_with(&format!("00-{TRACE_ID}-")), "{header}");
            assert!(
                !header.contains("00f067aa0ba902b7"),
                "a new span id: {header}"
            );
            assert_eq!(current_span_context().trace_id().to_string(), TRACE_ID);
        });
    }

    #[test]
    fn probes_are_not_traced_and_calls_without_context_start_a_trace() {
        tracing::subscriber::with_default(subscriber(), || {
            let probe = http::Request::builder()
                .uri("/grpc.health.v1.Health/Check")
                .body(())
                .unwrap();
            assert!(server_span(&probe).is_none());
            let call = http::Request::builder()
                .uri("/specd.v1.Drafter/Draft")
                .body(())
                .unwrap();
            let span = server_span(&call);
            let _entered = span.enter();
            assert!(current_span_context().is_valid());
        });
    }
}
