//! Who may do what, through real gRPC over TLS and mutual TLS with certificates made here: every
//! RPC × {no credential, wrong credential, agent in scope, agent out of scope, operator} gives
//! the expected code and reason, on both stores, and nothing a refused caller sends changes the
//! store. Untrusted certificates and the exposure rule are in `tls.rs`; rate and size limits in
//! `limits.rs`.

use oncegate_config::defaults;
use oncegate_domain::ActionKey;
use oncegate_grpc::{server::ServerOptions, tls};
use oncegate_proto::{
    self as pb, action_gate_service_client::ActionGateServiceClient,
    gate_admin_service_client::GateAdminServiceClient,
};
use tonic::{Code, Status, transport::Channel};
use tonic_types::StatusExt;

use crate::support::{
    Kind, OPS_KEY, Pki, TestGate, WORKER_KEY, authed, backend, config, expect_error, on_stores,
    principals_toml, tls_channel, token_request,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// TLS; callers authenticate with API keys.
    Tls,
    /// Mutual TLS; callers authenticate with client certificates.
    Mtls,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    NoCredential,
    WrongCredential,
    AgentInScope,
    AgentOutOfScope,
    Operator,
}

const CALLERS: [Caller; 5] = [
    Caller::NoCredential,
    Caller::WrongCredential,
    Caller::AgentInScope,
    Caller::AgentOutOfScope,
    Caller::Operator,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    RequestToken,
    Complete,
    Release,
    ExtendLease,
    GetAction,
    RecordExternalCompletion,
    ResolveExpired,
    ListUnresolved,
}

const RPCS: [Rpc; 8] = [
    Rpc::RequestToken,
    Rpc::Complete,
    Rpc::Release,
    Rpc::ExtendLease,
    Rpc::GetAction,
    Rpc::RecordExternalCompletion,
    Rpc::ResolveExpired,
    Rpc::ListUnresolved,
];

impl Rpc {
    fn operator_only(self) -> bool {
        matches!(
            self,
            Rpc::RecordExternalCompletion | Rpc::ResolveExpired | Rpc::ListUnresolved
        )
    }
}

/// How one caller reaches the gate: a channel and maybe an API key.
struct Client {
    channel: Channel,
    key: Option<&'static str>,
}

async fn client(addr: &str, pki: &Pki, mode: Mode, caller: Caller) -> Client {
    let (cert, key) = match (mode, caller) {
        (_, Caller::NoCredential) => (None, None),
        (Mode::Tls, Caller::WrongCredential) => (None, Some("not-a-key")),
        (Mode::Tls, Caller::AgentInScope | Caller::AgentOutOfScope) => (None, Some(WORKER_KEY)),
        (Mode::Tls, Caller::Operator) => (None, Some(OPS_KEY)),
        (Mode::Mtls, Caller::WrongCredential) => (Some(&pki.stranger), None),
        (Mode::Mtls, Caller::AgentInScope | Caller::AgentOutOfScope) => (Some(&pki.worker), None),
        (Mode::Mtls, Caller::Operator) => (Some(&pki.ops), None),
    };
    Client {
        channel: tls_channel(addr, &pki.ca.pem, cert).await.unwrap(),
        key,
    }
}

/// One call of `rpc` on `action` (a real token when the caller is probing someone else's).
async fn call(c: &Client, rpc: Rpc, action: &pb::ActionRef, token: &str) -> Result<(), Status> {
    let mut gate = ActionGateServiceClient::new(c.channel.clone());
    let mut admin = GateAdminServiceClient::new(c.channel.clone());
    let scope = action.scope.clone().unwrap();
    let k = c.key;
    let a = || Some(action.clone());
    let ttl = Some(prost_types::Duration {
        seconds: 60,
        nanos: 0,
    });
    match rpc {
        Rpc::RequestToken => gate
            .request_token(authed(
                token_request(&scope.agent_id, &scope.run_id, "matrix.probe", r#"{"n":1}"#),
                k,
            ))
            .await
            .map(drop),
        Rpc::Complete => gate
            .complete(authed(
                pb::CompleteRequest {
                    action: a(),
                    token: token.into(),
                    receipt: b"probe".to_vec(),
                },
                k,
            ))
            .await
            .map(drop),
        Rpc::Release => gate
            .release(authed(
                pb::ReleaseRequest {
                    action: a(),
                    token: token.into(),
                    reason: pb::ReleaseReason::NotAttempted as i32,
                },
                k,
            ))
            .await
            .map(drop),
        Rpc::ExtendLease => gate
            .extend_lease(authed(
                pb::ExtendLeaseRequest {
                    action: a(),
                    token: token.into(),
                    ttl,
                },
                k,
            ))
            .await
            .map(drop),
        Rpc::GetAction => gate
            .get_action(authed(pb::GetActionRequest { action: a() }, k))
            .await
            .map(drop),
        Rpc::RecordExternalCompletion => admin
            .record_external_completion(authed(
                pb::RecordExternalCompletionRequest {
                    action: a(),
                    receipt: b"by hand".to_vec(),
                    note: "probe".into(),
                    ..Default::default()
                },
                k,
            ))
            .await
            .map(drop),
        Rpc::ResolveExpired => admin
            .resolve_expired(authed(
                pb::ResolveExpiredRequest {
                    action: a(),
                    resolution: pb::Resolution::Failed as i32,
                    ..Default::default()
                },
                k,
            ))
            .await
            .map(drop),
        Rpc::ListUnresolved => admin
            .list_unresolved(authed(
                pb::ListUnresolvedRequest {
                    agent_id: scope.agent_id.clone(),
                    ..Default::default()
                },
                k,
            ))
            .await
            .map(drop),
    }
}

/// Grants a token on `agent` (as the operator) and returns the action and its token.
async fn seed(c: &Client, agent: &str, n: u32) -> (pb::ActionRef, String) {
    let mut gate = ActionGateServiceClient::new(c.channel.clone());
    let resp = gate
        .request_token(authed(
            token_request(
                agent,
                "run-1",
                "payments.transfer",
                &format!(r#"{{"n":{n}}}"#),
            ),
            c.key,
        ))
        .await
        .unwrap()
        .into_inner();
    (resp.action.unwrap(), resp.grant.unwrap().token)
}

fn key_of(action: &pb::ActionRef) -> ActionKey {
    let scope = action.scope.clone().unwrap();
    ActionKey::new(scope.agent_id, scope.run_id, action.key.clone())
}

async fn access_matrix(kind: Kind, mode: Mode) {
    let pki = Pki::new();
    let policies = config(&principals_toml(""));
    let settings = tls::settings(
        pki.server.cert.as_bytes(),
        pki.server.key.as_bytes(),
        (mode == Mode::Mtls).then_some(pki.ca.pem.as_bytes()),
        false,
    )
    .unwrap();
    let options = ServerOptions {
        tls: Some(settings),
        ..defaults::server()
    };
    let gate = TestGate::serve_with_options(backend(kind).await, policies, options).await;
    let addr = gate.addr.to_string();
    let store = gate.backend.store.clone();

    let operator = client(&addr, &pki, mode, Caller::Operator).await;
    // The victim: an action of an agent the worker may not act for, with a live token.
    let (victim, victim_token) = seed(&operator, "shipping-1", 1).await;
    let before = store.get(&key_of(&victim)).await.unwrap().result.unwrap();
    let mut in_scope_n = 10;

    for caller in CALLERS {
        let c = client(&addr, &pki, mode, caller).await;
        for rpc in RPCS {
            let (action, token) = match caller {
                Caller::AgentInScope | Caller::Operator => {
                    in_scope_n += 1;
                    seed(&operator, "billing-1", in_scope_n).await
                }
                _ => (victim.clone(), victim_token.clone()),
            };
            let result = call(&c, rpc, &action, &token).await;
            let what = format!("{kind:?} {mode:?} {caller:?} {rpc:?}: {result:?}");
            match caller {
                Caller::NoCredential | Caller::WrongCredential => {
                    let status = result.expect_err(&what);
                    expect_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
                }
                Caller::AgentOutOfScope => {
                    let status = result.expect_err(&what);
                    let meta = expect_error(&status, Code::PermissionDenied, "FORBIDDEN_SCOPE");
                    assert_eq!(meta["principal"], "billing-worker", "{what}");
                }
                Caller::AgentInScope if rpc.operator_only() => {
                    let status = result.expect_err(&what);
                    expect_error(&status, Code::PermissionDenied, "FORBIDDEN_SCOPE");
                }
                Caller::AgentInScope | Caller::Operator => {
                    if let Err(status) = &result {
                        assert!(
                            !matches!(
                                status.code(),
                                Code::Unauthenticated | Code::PermissionDenied
                            ),
                            "{what}"
                        );
                        // A domain answer (e.g. LEASE_NOT_EXPIRED for a live lease), never an
                        // access refusal.
                        assert!(status.get_error_details().error_info().is_some(), "{what}");
                    }
                }
            }
        }
    }
    // Nothing a refused caller sent reached the victim's record.
    let after = store.get(&key_of(&victim)).await.unwrap().result.unwrap();
    assert_eq!(
        after, before,
        "{kind:?} {mode:?}: a refused call changed the store"
    );
    let mut gate_client = ActionGateServiceClient::new(operator.channel.clone());
    let view = gate_client
        .get_action(authed(
            pb::GetActionRequest {
                action: Some(victim.clone()),
            },
            operator.key,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(view.state(), pb::ActionState::Authorized);
    assert_eq!(view.fencing, before.fencing);
}

async fn access_matrix_over_tls(kind: Kind) {
    access_matrix(kind, Mode::Tls).await;
}
on_stores!(access_matrix_over_tls: embedded, redis);

async fn access_matrix_over_mtls(kind: Kind) {
    access_matrix(kind, Mode::Mtls).await;
}
on_stores!(access_matrix_over_mtls: embedded, redis);
