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
    let mut messages = service
        .start_stream(completion.request, None, grant)
        .await?;
    let answer = Answer::new(api, response_id(api), model);
    if completion.stream {
        return Ok(stream(answer, messages, completion.include_usage).into_response());
    }
    let mut text = String::new();
    loop {
        match messages.recv().await {
            Some(Ok(message)) => {
                text.push_str(&message.text);
                if let Some(ending) = ending(message) {
                    let body = answer.whole(text, &ending);
                    return Ok(super::json_response(StatusCode::OK, &body));
                }
            }
            Some(Err(status)) => return Err(status.into()),
            None => return Err(ended_early()),
        }
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
    mut messages: mpsc::Receiver<Result<GenerateStreamResponse, Status>>,
    include_usage: bool,
) -> impl IntoResponse {
    let (events, receiver) = mpsc::channel::<Result<Event, Infallible>>(SSE_BUFFER);
    tokio::spawn(async move {
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
                    if !message.text.is_empty() {
                        pending.push(data(answer.text_chunk(&message.text)));
                    }
                    if let Some(ending) = ending(message) {
                        pending.push(data(answer.finish_chunk(&ending)));
                        if include_usage {
                            pending.push(data(answer.usage_chunk(&ending)));
                        }
                        pending.push(Event::default().data("[DONE]"));
                        last = true;
                    }
                }
                Some(Err(status)) => pending.push(data(ApiError::from(status).body())),
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
