//! One worker RPC each, as most tests call them without credentials: the reply unwrapped, or the
//! error status to check.

use oncegate::pb::{self, action_gate_service_client::ActionGateServiceClient};
use tonic::{Status, transport::Channel};

/// RequestToken, which must grant: the action and its grant.
pub async fn grant(
    client: &mut ActionGateServiceClient<Channel>,
    req: pb::RequestTokenRequest,
) -> (pb::ActionRef, pb::Grant) {
    let resp = client.request_token(req).await.unwrap().into_inner();
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
    client
        .complete(pb::CompleteRequest {
            action: Some(action.clone()),
            token: token.into(),
            receipt: receipt.to_vec(),
        })
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
