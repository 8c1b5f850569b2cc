//! One worker RPC each, without credentials as most tests call them or with an API key (`_as`):
//! the reply unwrapped, or the error status to check; and the operator's listing of what is
//! unresolved, and a wait for an action to complete, which the resolver tests share.

use std::time::Duration;

use oncegate_proto::{
    self as pb, action_gate_service_client::ActionGateServiceClient,
    gate_admin_service_client::GateAdminServiceClient,
};
use tonic::{Status, transport::Channel};

use super::authed;

/// RequestToken, which must grant: the action and its grant.
pub async fn grant(
    client: &mut ActionGateServiceClient<Channel>,
    req: pb::RequestTokenRequest,
) -> (pb::ActionRef, pb::Grant) {
    grant_as(client, req, None).await
}

/// RequestToken with `key`'s credential (none: anonymous), which must grant: the action and its
/// grant.
pub async fn grant_as(
    client: &mut ActionGateServiceClient<Channel>,
    req: pb::RequestTokenRequest,
    key: Option<&str>,
) -> (pb::ActionRef, pb::Grant) {
    let resp = client
        .request_token(authed(req, key))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.decision(), pb::Decision::Granted, "{resp:?}");
    (resp.action.unwrap(), resp.grant.unwrap())
}

/// Complete with `token` and `receipt`: the completion, or the refusal.
pub async fn complete(
    client: &mut ActionGateServiceClient<Channel>,
    action: &pb::ActionRef,
    token: &str,
    receipt: &[u8],
) -> Result<pb::Completion, Status> {
    complete_as(client, action, token, receipt, None).await
}

/// Complete with `token` and `receipt` and `key`'s credential (none: anonymous): the completion,
/// or the refusal.
pub async fn complete_as(
    client: &mut ActionGateServiceClient<Channel>,
    action: &pb::ActionRef,
    token: &str,
    receipt: &[u8],
    key: Option<&str>,
) -> Result<pb::Completion, Status> {
    let request = pb::CompleteRequest {
        action: Some(action.clone()),
        token: token.into(),
        receipt: receipt.to_vec(),
    };
    client
        .complete(authed(request, key))
        .await
        .map(|r| r.into_inner().completion.unwrap())
}

/// Release as a definite failure: the fencing number, or the refusal.
pub async fn release(
    client: &mut ActionGateServiceClient<Channel>,
    action: &pb::ActionRef,
    token: &str,
) -> Result<u64, Status> {
    client
        .release(pb::ReleaseRequest {
            action: Some(action.clone()),
            token: token.into(),
            reason: pb::ReleaseReason::DefiniteFailure as i32,
        })
        .await
        .map(|r| r.into_inner().fencing)
}

/// GetAction, which must answer.
pub async fn state(
    client: &mut ActionGateServiceClient<Channel>,
    action: &pb::ActionRef,
) -> pb::GetActionResponse {
    client
        .get_action(pb::GetActionRequest {
            action: Some(action.clone()),
        })
        .await
        .unwrap()
        .into_inner()
}

/// ListUnresolved of `agent` (its first page) with `key`'s credential, which must answer.
pub async fn unresolved_of(
    admin: &mut GateAdminServiceClient<Channel>,
    agent: &str,
    key: &str,
) -> Vec<pb::UnresolvedAction> {
    admin
        .list_unresolved(authed(
            pb::ListUnresolvedRequest {
                agent_id: agent.into(),
                ..Default::default()
            },
            Some(key),
        ))
        .await
        .unwrap()
        .into_inner()
        .actions
}

/// Waits, reading GetAction with `key`'s credential every 100 ms, until `action` is COMPLETED;
/// fails the test after `patience` (a failure bound, not a timing assertion).
pub async fn wait_until_completed(
    client: &mut ActionGateServiceClient<Channel>,
    action: &pb::ActionRef,
    key: Option<&str>,
    patience: Duration,
) {
    let get = pb::GetActionRequest {
        action: Some(action.clone()),
    };
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let view = client
            .get_action(authed(get.clone(), key))
            .await
            .unwrap()
            .into_inner();
        if view.state() == pb::ActionState::Completed {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled: {view:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
