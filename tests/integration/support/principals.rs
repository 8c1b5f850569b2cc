//! Who calls a gate with principals configured: a worker for the `billing-*` agents and an operator,
//! each with an API key and a certificate identity, and requests carrying a key.

use oncegate_grpc::auth::hash_key;
use tonic::Request;

/// The worker principal's API key.
pub const WORKER_KEY: &str = "worker-secret-key-1";
/// The operator principal's API key.
pub const OPS_KEY: &str = "ops-secret-key-1";

/// The principals of every test with access control: a worker for `billing-*`
/// (`billing-worker`, certificate `worker.billing`, plus `extra` settings) and an operator for
/// everything (`ops`, certificate `ops.example`).
pub fn principals_toml(extra: &str) -> String {
    format!(
        r#"
        [[principals]]
        name = "billing-worker"
        role = "agent"
        agents = ["billing-*"]
        api_key_sha256 = "{}"
        cert_identity = "worker.billing"
        {extra}

        [[principals]]
        name = "ops"
        role = "operator"
        api_key_sha256 = "{}"
        cert_identity = "ops.example"
        "#,
        hash_key(WORKER_KEY),
        hash_key(OPS_KEY)
    )
}

/// A message with an `authorization` header when a key is given.
pub fn authed<T>(message: T, key: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    request
}
