//! Event sinks that act on the request while it runs.

use std::future::Future;

use specd_core::round_loop::SinkClosed;
use specd_core::{Event, EventSink, RequestControl};

/// Collects events and calls `on_event(events_so_far, control)` after each.
pub struct ReactingSink<F> {
    pub events: Vec<Event>,
    pub control: RequestControl,
    pub on_event: F,
}

impl<F: FnMut(usize, &RequestControl) + Send> EventSink for ReactingSink<F> {
    fn send(&mut self, event: Event) -> impl Future<Output = Result<(), SinkClosed>> + Send {
        self.events.push(event);
        (self.on_event)(self.events.len(), &self.control);
        std::future::ready(Ok(()))
    }
}

/// Accepts `open_for` events, then reports the receiver gone.
pub struct ClosingSink {
    pub events: Vec<Event>,
    pub open_for: usize,
}

impl EventSink for ClosingSink {
    fn send(&mut self, event: Event) -> impl Future<Output = Result<(), SinkClosed>> + Send {
        let result = if self.events.len() < self.open_for {
            self.events.push(event);
            Ok(())
        } else {
            Err(SinkClosed)
        };
        std::future::ready(result)
    }
}
