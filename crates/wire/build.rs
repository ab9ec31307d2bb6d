//! Compiles `proto/specd/v1/*.proto` with protox (no `protoc` needed) and generates the tonic
//! clients and servers into `OUT_DIR`. The encoded descriptor set is written next to the code so
//! that servers can offer gRPC reflection.

use std::error::Error;
use std::path::PathBuf;

use protox::prost::Message;

const PROTO_FILES: [&str; 7] = [
    "specd/v1/tensor.proto",
    "specd/v1/placement.proto",
    "specd/v1/kv.proto",
    "specd/v1/sampling.proto",
    "specd/v1/generate.proto",
    "specd/v1/verifier.proto",
    "specd/v1/drafter.proto",
];

/// Name of the descriptor file inside `OUT_DIR`; `src/descriptor.rs` includes it.
const DESCRIPTOR_FILE: &str = "specd_v1_descriptor.bin";

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    println!("cargo:rerun-if-changed={}", proto_root.display());
    for file in PROTO_FILES {
        println!("cargo:rerun-if-changed={}", proto_root.join(file).display());
    }

    let descriptor_set = protox::compile(PROTO_FILES, [&proto_root])?;
    std::fs::write(
        out_dir.join(DESCRIPTOR_FILE),
        descriptor_set.encode_to_vec(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Tensor payloads and snapshot chunks are sliced without copying.
        .bytes(".")
        .out_dir(&out_dir)
        .compile_fds(descriptor_set)?;
    Ok(())
}
