//! Running one completion: a whole JSON answer, or server-sent events ending in
//! `data: [DONE]`. A client that goes away drops the request's stream, which cancels it and
//! frees its verifier sequence and drafter session.

use std::convert::Infallible;
use std::hash::{BuildHasher, RandomState};

use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use specd_wire::generation::{GenerateStreamResponse, GenerationStats};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::error::ApiError;
use super::relay::{whole_choice, Relay, Shape};
use super::request::Completion;
use super::response::{Answer, Api, Ending};
use crate::auth::KeyGrant;
use crate::service::GenerationService;

/// Events buffered per stream before the relay waits for the client.
const SSE_BUFFER: usize = 16;

pub async fn run(
    service: &GenerationService,
    api: Api,
    model: String,
    completion: Completion,
    grant: Option<KeyGrant>,
) -> Result<Response, ApiError> {
    let shape = Shape::of(api, &completion);
    let names = FieldNames {
        api,
        constraint: completion.constraint_field,
    };
    let mut messages = service
        .start_stream(completion.request, None, grant)
        .await
        .map_err(|status| names.error(status))?;
    let answer = Answer::new(api, response_id(api), model);
    if completion.stream {
        let relay = Relay::new(shape);
        return Ok(stream(
            answer,
            relay,
            service.clone(),
            messages,
            completion.include_usage,
            names,
        )
        .into_response());
    }
    let mut text = String::new();
    let mut logprobs = Vec::new();
    loop {
        match messages.recv().await {
            Some(Ok(mut message)) => {
                text.push_str(&message.text);
                logprobs.append(&mut message.logprobs);
                if let Some(ending) = ending(message) {
                    let choice = whole_choice(shape, text, &logprobs, service.text());
                    let body = answer.whole(choice, &ending);
                    return Ok(super::json_response(StatusCode::OK, &body));
                }
            }
            Some(Err(status)) => return Err(names.error(status)),
            None => return Err(ended_early()),
        }
    }
}

/// Renames the router's fields in its errors to the request fields a client wrote: the
/// gRPC request nests sampling parameters and calls the output constraint `constraint`,
/// whichever field it came from.
#[derive(Debug, Clone, Copy)]
struct FieldNames {
    api: Api,
    constraint: Option<&'static str>,
}

impl FieldNames {
    fn error(self, status: Status) -> ApiError {
        let mut error = ApiError::from(status);
        let Some(param) = error.param.clone() else {
            return error;
        };
        if let Some(field) = param.strip_prefix("sampling.") {
            error.message = error.message.replacen(&param, field, 1);
            error.param = Some(field.to_owned());
        } else if param == "constraint" || param.starts_with("constraint.") {
            if let Some(field) = self.constraint {
                error.message = format!("{field}: {}", error.message);
                error.param = Some(field.to_owned());
            }
        } else if param == "top_logprobs" && self.api == Api::Text {
            error.message = error.message.replacen(&param, "logprobs", 1);
            error.param = Some("logprobs".to_owned());
        }
        error
    }
}

fn ending(message: GenerateStreamResponse) -> Option<Ending> {
    let reason = message.finish_reason();
    let stats: GenerationStats = message.stats?;
    Some(Ending {
        reason,
        matched_stop: message.matched_stop,
        stats,
    })
}

fn ended_early() -> ApiError {
    ApiError::from(Status::internal(
        "the completion ended without its last message",
    ))
}

/// Relays the request's messages as events; stops (and so cancels the request) as soon as
/// the client is gone.
fn stream(
    answer: Answer,
    mut relay: Relay,
    service: GenerationService,
    mut messages: mpsc::Receiver<Result<GenerateStreamResponse, Status>>,
    include_usage: bool,
    names: FieldNames,
) -> impl IntoResponse {
    let (events, receiver) = mpsc::channel::<Result<Event, Infallible>>(SSE_BUFFER);
    tokio::spawn(async move {
        let text = service.text();
        let data = |value: serde_json::Value| Event::default().data(value.to_string());
        let mut pending: Vec<Event> = answer.role_chunk().map(data).into_iter().collect();
        let mut last = false;
        loop {
            for event in pending.drain(..) {
                if events.send(Ok(event)).await.is_err() {
                    return;
                }
            }
            if last {
                return;
            }
            let next = tokio::select! {
                next = messages.recv() => next,
                () = events.closed() => return,
            };
            match next {
                Some(Ok(message)) => {
                    pending.extend(relay.chunks(&answer, &message, text).into_iter().map(data));
                    if let Some(ending) = ending(message) {
                        pending.extend(relay.finish(&answer, &ending).into_iter().map(data));
                        if include_usage {
                            pending.push(data(answer.usage_chunk(&ending)));
                        }
                        pending.push(Event::default().data("[DONE]"));
                        last = true;
                    }
                }
                Some(Err(status)) => pending.push(data(names.error(status).body())),
                None => {
                    pending.push(data(ended_early().body()));
                    last = true;
                }
            }
        }
    });
    Sse::new(ReceiverStream::new(receiver)).keep_alive(KeepAlive::default())
}

/// An id no client can guess or collide with.
fn response_id(api: Api) -> String {
    let prefix = match api {
        Api::Chat => "chatcmpl",
        Api::Text => "cmpl",
    };
    let random = RandomState::new().hash_one(std::time::Instant::now());
    let more = RandomState::new().hash_one(random);
    format!("{prefix}-{random:016x}{more:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_field_names_become_the_clients() {
        let names = FieldNames {
            api: Api::Chat,
            constraint: Some("response_format"),
        };
        let penalty = names.error(Status::invalid_argument(
            "sampling.presence_penalty: must be within [-2, 2], not 3",
        ));
        assert_eq!(penalty.param.as_deref(), Some("presence_penalty"));
        assert_eq!(
            penalty.message,
            "presence_penalty: must be within [-2, 2], not 3"
        );
        let schema = names.error(Status::invalid_argument(
            "constraint.json_schema: not a valid schema",
        ));
        assert_eq!(schema.param.as_deref(), Some("response_format"));
        assert_eq!(
            schema.message,
            "response_format: constraint.json_schema: not a valid schema"
        );
        let legacy = FieldNames {
            api: Api::Text,
            constraint: None,
        };
        let top = legacy.error(Status::invalid_argument("top_logprobs: at most 20"));
        assert_eq!(top.param.as_deref(), Some("logprobs"));
        assert_eq!(top.message, "logprobs: at most 20");
        let other = legacy.error(Status::invalid_argument("max_tokens: must be at least 1"));
        assert_eq!(other.param.as_deref(), Some("max_tokens"));
        let unnamed = legacy.error(Status::invalid_argument("constraint: bad"));
        assert_eq!(unnamed.param.as_deref(), Some("constraint"));
    }
}
