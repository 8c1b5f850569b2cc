//! Signing in tests: fixed keys (the same seeds as `tests/vectors/generate.py`'s test keys), the
//! gate's signer made from them, and gates that sign.

use std::sync::Arc;

use oncegate_config::{ConfigFile, defaults};
use oncegate_domain::statement::StatementKey;
use oncegate_gate::{Gate, Signer};
use oncegate_grpc::server::ServerOptions;

use super::{gate::TestGate, stores::Kind};

/// Test key `n`: the seed is 32 bytes of `n` (never use such a key anywhere else).
pub fn test_key(n: u8) -> StatementKey {
    StatementKey::from_seed(&[n; 32])
}

/// A signer with test key 1 active and test key 2 retired.
pub fn test_signer() -> Arc<Signer> {
    Signer::new("oncegate-test", test_key(1), [test_key(2).public()])
}

impl TestGate {
    /// Serves a fresh store of `kind` with `config` (policies and principals), signing grants and
    /// receipts with `signer`.
    pub async fn start_signed(
        kind: Kind,
        config: impl Into<ConfigFile>,
        signer: Arc<Signer>,
    ) -> Self {
        let backend = super::stores::backend(kind).await;
        let ConfigFile {
            policies,
            principals,
            authorization,
            ..
        } = config.into();
        let gate = Gate::new(backend.store.clone(), policies)
            .with_authorization(authorization)
            .with_signer(signer);
        let options = ServerOptions {
            principals,
            ..defaults::server()
        };
        Self::serve_gate(backend, gate, options).await
    }
}
