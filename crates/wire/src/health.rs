//! `grpc.health.v1` for specd servers.
//!
//! A server starts NOT_SERVING (overall and per service) and flips to SERVING once it can
//! answer, for example after the verifier has loaded its weights; it flips back while draining.

use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;
pub use tonic_health::ServingStatus;

use crate::descriptor::SpecdService;

/// The health status of one server's specd services, shared with its health service.
#[derive(Debug, Clone)]
pub struct HealthState {
    reporter: HealthReporter,
    services: Vec<SpecdService>,
}

impl HealthState {
    /// The health service for a server hosting `services`, all of them NOT_SERVING, as is
    /// the overall status (the empty service name).
    pub async fn starting(services: &[SpecdService]) -> (Self, HealthServer<impl Health>) {
        let (reporter, server) = tonic_health::server::health_reporter();
        let state = Self {
            reporter,
            services: services.to_vec(),
        };
        state.set_all(ServingStatus::NotServing).await;
        (state, server)
    }

    /// Reports every hosted service, and the server as a whole, as SERVING.
    pub async fn set_serving(&self) {
        self.set_all(ServingStatus::Serving).await;
    }

    /// Reports every hosted service, and the server as a whole, as NOT_SERVING.
    pub async fn set_not_serving(&self) {
        self.set_all(ServingStatus::NotServing).await;
    }

    /// The underlying reporter, for finer-grained statuses.
    pub fn reporter(&self) -> &HealthReporter {
        &self.reporter
    }

    async fn set_all(&self, status: ServingStatus) {
        self.reporter.set_service_status("", status).await;
        for service in &self.services {
            self.reporter
                .set_service_status(service.name(), status)
                .await;
        }
    }
}
