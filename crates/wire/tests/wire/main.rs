//! The wire crate's tests, one binary: the tensor and K/V codecs, the proto documentation,
//! and health, reflection and message limits on real tonic servers.

mod kv_transfer;
mod proto_docs;
mod server_plumbing;
mod tensor_codec;
