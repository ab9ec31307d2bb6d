//! Where a request's events go: a stream to the client, or a transcript for a unary answer.

use std::sync::Arc;
use std::time::Duration;

use specd_core::round_loop::SinkClosed;
use specd_core::{Event, EventSink, TokenDelta};
use specd_wire::generation::{FinishReason, GenerateStreamResponse};
use tokio::sync::mpsc;
use tonic::Status;

use crate::admission::AnswerDone;
use crate::report::{RequestFacts, Transcript};
use specd_text::TargetText;

/// Collects a unary request's output.
#[derive(Default)]
pub struct CollectSink {
    pub transcript: Transcript,
    /// One per token, when the request asked for log probabilities.
    pub logprobs: Vec<specd_wire::TokenLogprob>,
}

impl EventSink for CollectSink {
    async fn send(&mut self, event: Event) -> Result<(), SinkClosed> {
        if let Event::Tokens(delta) = &event {
            self.transcript.record(delta);
            self.logprobs.extend(logprobs_to_wire(delta));
        }
        Ok(())
    }
}

/// A delta's log probabilities on the wire.
fn logprobs_to_wire(delta: &TokenDelta) -> impl Iterator<Item = specd_wire::TokenLogprob> + '_ {
    delta
        .logprobs
        .iter()
        .map(specd_wire::sampling::logprob_to_wire)
}

/// Sends each step to a streaming client; the receiver going away cancels the request.
pub struct StreamSink {
    sender: mpsc::Sender<Result<GenerateStreamResponse, Status>>,
    transcript: Transcript,
    facts: RequestFacts,
    text: Arc<TargetText>,
    /// How long a message may wait for the client to read (`None`: forever).
    stall_timeout: Option<Duration>,
    /// Told when the last message is ready, before it is queued: the client may send its
    /// next request as soon as it reads it, while this one still cleans up.
    answer_done: Option<AnswerDone>,
}

impl StreamSink {
    pub fn new(
        sender: mpsc::Sender<Result<GenerateStreamResponse, Status>>,
        facts: RequestFacts,
        text: Arc<TargetText>,
        stall_timeout: Option<Duration>,
    ) -> Self {
        Self {
            sender,
            transcript: Transcript::default(),
            facts,
            text,
            stall_timeout,
            answer_done: None,
        }
    }

    /// This sink marking the request answered when its last message is ready.
    pub(crate) fn marking(self, answer_done: AnswerDone) -> Self {
        Self {
            answer_done: Some(answer_done),
            ..self
        }
    }
}

impl EventSink for StreamSink {
    async fn send(&mut self, event: Event) -> Result<(), SinkClosed> {
        let message = match event {
            Event::Tokens(delta) => {
                self.transcript.record(&delta);
                let logprobs = logprobs_to_wire(&delta).collect();
                GenerateStreamResponse {
                    token_ids: delta.tokens,
                    text: delta.text,
                    finish_reason: FinishReason::Unspecified.into(),
                    stats: None,
                    matched_stop: String::new(),
                    logprobs,
                }
            }
            Event::Finished(finish) => {
                if let Some(done) = self.answer_done.take() {
                    done.mark();
                }
                let report = self.facts.report(&finish, &self.transcript, &self.text);
                GenerateStreamResponse {
                    token_ids: Vec::new(),
                    text: String::new(),
                    finish_reason: report.finish_reason.into(),
                    stats: Some(report.stats),
                    matched_stop: report.matched_stop,
                    logprobs: Vec::new(),
                }
            }
        };
        // A client that stopped reading holds its place, sequence and session until this
        // ends it: the request is dropped like a cancelled one.
        send_unless_stalled(&self.sender, Ok(message), self.stall_timeout).await
    }
}

/// Queues `message` for the client, waiting at most `stall_timeout` (`None`: forever) for
/// room; `SinkClosed` when the client is gone or read nothing for that long.
pub(crate) async fn send_unless_stalled(
    sender: &mpsc::Sender<Result<GenerateStreamResponse, Status>>,
    message: Result<GenerateStreamResponse, Status>,
    stall_timeout: Option<Duration>,
) -> Result<(), SinkClosed> {
    let send = sender.send(message);
    match stall_timeout {
        None => send.await.map_err(|_| SinkClosed),
        Some(timeout) => match tokio::time::timeout(timeout, send).await {
            Ok(sent) => sent.map_err(|_| SinkClosed),
            Err(_) => {
                tracing::warn!(
                    ?timeout,
                    "stream client read nothing for --stream-stall-timeout-secs; request ended"
                );
                Err(SinkClosed)
            }
        },
    }
}
