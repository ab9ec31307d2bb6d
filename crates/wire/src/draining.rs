//! Draining a server before it stops: calls that would start new work (a Prefill, an Open)
//! are refused with UNAVAILABLE while calls on work already running go on, so that clients
//! finish their requests and go elsewhere for new ones.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::Status;

/// Shared switch: once started, the wrapped services refuse new work.
#[derive(Debug, Clone, Default)]
pub struct DrainSwitch(Arc<AtomicBool>);

impl DrainSwitch {
    pub fn start(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// A gRPC service whose `methods` (bare method names, e.g. `Prefill`) answer UNAVAILABLE
/// once `switch` is started.
#[derive(Debug, Clone)]
pub struct RefuseWhileDraining<S> {
    inner: S,
    switch: DrainSwitch,
    methods: &'static [&'static str],
}

impl<S> RefuseWhileDraining<S> {
    pub fn new(inner: S, switch: DrainSwitch, methods: &'static [&'static str]) -> Self {
        Self {
            inner,
            switch,
            methods,
        }
    }
}

impl<S: NamedService> NamedService for RefuseWhileDraining<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for RefuseWhileDraining<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + NamedService,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request.uri().path().rsplit('/').next().unwrap_or_default();
        if self.switch.is_draining() && self.methods.contains(&method) {
            let status =
                Status::unavailable(format!("{}: shutting down, not taking new work", S::NAME));
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        Box::pin(self.inner.call(request))
    }
}
