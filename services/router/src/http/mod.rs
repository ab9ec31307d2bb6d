//! The OpenAI-compatible HTTP API of the router: `POST /v1/chat/completions`,
//! `POST /v1/completions`, `GET /v1/models` and `GET /health`, over the same validation,
//! admission, round loop and telemetry as the gRPC Generation service.

mod completion;
mod constraint;
mod error;
mod gemma_args;
mod gemma_grammar;
mod logprobs;
mod relay;
mod request;
mod response;
mod tls_listener;
mod tool_calls;
mod tool_stream;
mod tools;

use std::future::Future;
use std::sync::Arc;

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tracing::Instrument;

pub use error::ApiError;
use response::Api;

use crate::auth::KeyGrant;
use crate::service::GenerationService;
use tool_calls::ToolSyntax;

/// What the handlers share.
struct HttpState {
    service: GenerationService,
    /// The name clients use in `model` (and `/v1/models` lists).
    model: String,
    /// How the target writes tool calls.
    tool_syntax: ToolSyntax,
}

/// Serves the HTTP API on `listener` until `shutdown` resolves; requests running then
/// finish first.
pub async fn serve_http(
    service: GenerationService,
    listener: TcpListener,
    model_name: Option<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let body_limit = service.config().limits.max_message_bytes();
    let model = model_name
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| match service.target_limits().model.as_str() {
            "" => "specd".to_owned(),
            name => name.to_owned(),
        });
    let tls = match &service.config().serving.tls {
        Some(tls) => Some(tls.http().map_err(std::io::Error::other)?),
        None => None,
    };
    let tool_syntax = ToolSyntax::of(service.text());
    let state = Arc::new(HttpState {
        service,
        model,
        tool_syntax,
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model_by_id))
        .route("/health", get(health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state);
    match tls {
        Some(config) => {
            axum::serve(tls_listener::TlsListener::new(listener, config)?, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
}

async fn chat_completions(
    State(state): State<Arc<HttpState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let span = specd_telemetry::propagation::http_server_span(
        &Method::POST,
        "/v1/chat/completions",
        &headers,
    );
    respond(&state, Api::Chat, &headers, body)
        .instrument(span)
        .await
}

async fn completions(
    State(state): State<Arc<HttpState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let span =
        specd_telemetry::propagation::http_server_span(&Method::POST, "/v1/completions", &headers);
    respond(&state, Api::Text, &headers, body)
        .instrument(span)
        .await
}

/// The caller's API key, when the router has keys: a 401 error without a known one.
fn authorize(state: &HttpState, headers: &HeaderMap) -> Result<Option<KeyGrant>, ApiError> {
    let authorization = headers
        .get(axum::http::header::AUTHORIZATION)
        .map(|value| value.to_str().unwrap_or_default());
    Ok(state.service.authorize(authorization)?)
}

async fn respond(
    state: &HttpState,
    api: Api,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let grant = authorize(state, headers)?;
        let body =
            body.map_err(|rejection| ApiError::new(rejection.status(), rejection.body_text()))?;
        let value = request::parse_body(&body)?;
        let completion = match api {
            Api::Chat => request::chat(&value, state.tool_syntax)?,
            Api::Text => request::text(&value)?,
        };
        if let Some(asked) = completion.model.as_deref() {
            if asked != state.model {
                return Err(ApiError::unknown_model(format!(
                    "model: {asked:?} is not served here; this server serves {:?}",
                    state.model
                )));
            }
        }
        completion::run(&state.service, api, state.model.clone(), completion, grant).await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

fn model_card(id: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": "specd"})
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn models(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    if let Err(error) = authorize(&state, &headers) {
        return error.into_response();
    }
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [model_card(&state.model)]}),
    )
}

async fn model_by_id(
    State(state): State<Arc<HttpState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(error) = authorize(&state, &headers) {
        return error.into_response();
    }
    if id == state.model {
        json_response(StatusCode::OK, &model_card(&state.model))
    } else {
        ApiError::unknown_model(format!("model: {id:?} is not served here")).into_response()
    }
}

/// 200 while the router takes requests and its verifier answers; 503 otherwise.
async fn health(State(state): State<Arc<HttpState>>) -> Response {
    let problem = if state.service.is_draining() {
        Some("draining: new requests are refused")
    } else if !*state.service.verifier_reachable().borrow() {
        Some("the verifier does not answer")
    } else {
        None
    };
    match problem {
        None => json_response(StatusCode::OK, &json!({"status": "ok"})),
        Some(problem) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, problem).into_response(),
    }
}

async fn not_found(method: Method, uri: axum::http::Uri) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("{method} {}: no such route", uri.path()),
    )
    .into_response()
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} {}: method not allowed", uri.path()),
    )
    .into_response()
}
