//! The compiled protocol descriptors and the gRPC reflection service built from them.

use tonic_reflection::server::v1::{ServerReflection, ServerReflectionServer};

use crate::drafter::DRAFTER_SERVICE_NAME;
use crate::generation::GENERATION_SERVICE_NAME;
use crate::verifier::VERIFIER_SERVICE_NAME;

/// The encoded `FileDescriptorSet` of `proto/specd/v1/*.proto`, comments included.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/specd_v1_descriptor.bin"));

/// The gRPC services specd defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpecdService {
    /// `specd.v1.Generation`, the public API (router).
    Generation,
    /// `specd.v1.Verifier` (verifier).
    Verifier,
    /// `specd.v1.Drafter` (drafter).
    Drafter,
}

impl SpecdService {
    pub const ALL: [SpecdService; 3] = [Self::Generation, Self::Verifier, Self::Drafter];

    /// The fully qualified gRPC service name, as health checks and reflection use it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Generation => GENERATION_SERVICE_NAME,
            Self::Verifier => VERIFIER_SERVICE_NAME,
            Self::Drafter => DRAFTER_SERVICE_NAME,
        }
    }

    /// The specd server that hosts this service.
    pub fn server(self) -> &'static str {
        match self {
            Self::Generation => "router",
            Self::Verifier => "verifier",
            Self::Drafter => "drafter",
        }
    }
}

impl std::fmt::Display for SpecdService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The reflection service could not be built from the descriptors.
#[derive(Debug, thiserror::Error)]
#[error("building the gRPC reflection service: {0}")]
pub struct ReflectionError(#[from] tonic_reflection::server::Error);

/// A `grpc.reflection.v1` service that advertises `services`, the health service and itself,
/// and can describe every specd message (so `grpcurl` works without .proto files).
pub fn reflection_service(
    services: &[SpecdService],
) -> Result<ServerReflectionServer<impl ServerReflection>, ReflectionError> {
    let mut builder = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name(tonic_health::pb::health_server::SERVICE_NAME)
        .with_service_name(tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME);
    for service in services {
        builder = builder.with_service_name(service.name());
    }
    Ok(builder.build_v1()?)
}
