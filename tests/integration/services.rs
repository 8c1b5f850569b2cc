//! The standard services beside the gate (health, reflection v1 and v1alpha) and start-up logging.

use std::{
    io::{BufRead, BufReader, Read},
    process::{Command, Stdio},
};

use tempfile::TempDir;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_reflection::pb::{v1, v1alpha};

use crate::support::{Kind, RedisServer, TestGate};

async fn channel(gate: &TestGate) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", gate.addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn health_reports_the_overall_and_the_gate_service() {
    let gate = TestGate::start(Kind::Embedded).await;
    let mut health = HealthClient::new(channel(&gate).await);
    for service in ["", "oncegate.v1.ActionGateService"] {
        // The store monitor sets the service entry shortly after start.
        let mut status = ServingStatus::Unknown;
        for _ in 0..50 {
            let reply = health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await;
            if let Ok(reply) = reply {
                status = reply.into_inner().status();
                if status == ServingStatus::Serving {
                    break;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(status, ServingStatus::Serving, "{service:?}");
    }
}

#[tokio::test]
async fn reflection_v1_and_v1alpha_list_the_gate() {
    let gate = TestGate::start(Kind::Embedded).await;
    let ch = channel(&gate).await;

    let mut client = v1::server_reflection_client::ServerReflectionClient::new(ch.clone());
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let reply = stream.next().await.unwrap().unwrap();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("unexpected reflection reply");
    };
    assert!(
        list.service
            .iter()
            .any(|s| s.name == "oncegate.v1.ActionGateService")
    );

    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(ch);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
                "oncegate.v1.ActionGateService".into(),
            ),
        ),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let reply = stream.next().await.unwrap().unwrap();
    assert!(matches!(
        reply.message_response,
        Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(_))
    ));
}

#[test]
fn startup_warns_when_redis_keeps_nothing_and_json_logs_are_json() {
    let redis = RedisServer::start();
    let dir = TempDir::new().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--redis-url",
            &redis.url(),
        ])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("listening on 127.0.0.1:"), "{line:?}");
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    child.wait().unwrap();
    let mut logs = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["level"] == "WARN"
            && l["store"]
                .as_str()
                .unwrap_or("")
                .contains("keeps nothing on disk")),
        "{logs}"
    );
}

#[tokio::test]
async fn a_plaintext_health_only_listener_answers_probes() {
    let port = crate::support::free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let options = oncegate_grpc::server::ServerOptions {
        health_listen: Some(addr),
        ..oncegate_config::defaults::server()
    };
    let backend = crate::support::backend(Kind::Embedded).await;
    let _gate =
        TestGate::serve_with_options(backend, oncegate_gate::policy::Policies::default(), options)
            .await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(std::time::Duration::from_secs(5));
    let mut status = ServingStatus::Unknown;
    for _ in 0..50 {
        if let Ok(ch) = channel.connect().await {
            let mut health = HealthClient::new(ch.clone());
            if let Ok(reply) = health
                .check(HealthCheckRequest {
                    service: "oncegate.v1.ActionGateService".into(),
                })
                .await
            {
                status = reply.into_inner().status();
                if status == ServingStatus::Serving {
                    // Only health lives there: the gate service is not served on it.
                    let mut gate =
                        oncegate_proto::action_gate_service_client::ActionGateServiceClient::new(
                            ch,
                        );
                    let err = gate
                        .get_action(oncegate_proto::GetActionRequest { action: None })
                        .await
                        .unwrap_err();
                    assert_eq!(err.code(), tonic::Code::Unimplemented);
                    break;
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(status, ServingStatus::Serving);
}
