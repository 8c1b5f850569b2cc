//! The standard gRPC health service as a probe asks it: the overall entry (liveness) and the gate
//! service's entry (readiness, following the store).

use std::time::{Duration, Instant};

use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// One health check of `service` ("" for the overall entry) on the gate at `addr`.
pub async fn health(addr: &str, service: &str) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let resp = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner();
    resp.status()
}

/// Polls (up to 10 s) until the gate service's readiness entry is `want`.
pub async fn wait_for_health(addr: &str, want: ServingStatus) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while health(addr, oncegate_grpc::server::SERVICE_NAME).await != want {
        assert!(Instant::now() < deadline, "health never became {want:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
