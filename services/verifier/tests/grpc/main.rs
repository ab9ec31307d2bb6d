//! The Verifier gRPC service on a real server bound to 127.0.0.1, running the tiny Gemma 4
//! target fixture.

mod support;

mod batching;
mod deltas;
mod errors;
mod lifecycle;
mod prefill;
mod rounds;
