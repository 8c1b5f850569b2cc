//! The gate service called in its own process (`oncegate_grpc::in_process::InProcess`, where the
//! Python client's `oncegate.local` sends its worker calls): the answers and errors of the
//! listener, call for call, and the listener's credentials.

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use http::{Method, Request};
use http_body_util::{BodyExt as _, Full};
use oncegate_config::defaults;
use oncegate_gate::Gate;
use oncegate_grpc::{in_process::InProcess, server::ServerOptions};
use oncegate_proto as pb;
use prost::Message;
use tonic::{Code, Status, body::Body};

use crate::support::{
    Kind, TestGate, WORKER_KEY, backend, config, expect_error, on_stores, principals_toml, reason,
    token_request,
};

/// One unary call of `method` on `service`, as the Python client's native core makes it: the
/// response message, or the status.
async fn call<M: Message, R: Message + Default>(
    service: &InProcess,
    method: &str,
    message: &M,
    api_key: Option<&str>,
) -> Result<R, Status> {
    let bytes = message.encode_to_vec();
    let mut framed = BytesMut::with_capacity(5 + bytes.len());
    framed.put_u8(0);
    framed.put_u32(u32::try_from(bytes.len()).unwrap());
    framed.put_slice(&bytes);
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(format!("/oncegate.v1.ActionGateService/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(key) = api_key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let request = request.body(Body::new(Full::new(framed.freeze()))).unwrap();
    let (parts, body) = service.call(request).await.into_parts();
    assert_eq!(parts.status, http::StatusCode::OK);
    if let Some(status) = Status::from_header_map(&parts.headers) {
        return Err(status);
    }
    let collected = body.collect().await.unwrap();
    let status = Status::from_header_map(collected.trailers().expect("trailers")).unwrap();
    if status.code() != Code::Ok {
        return Err(status);
    }
    let mut data: Bytes = collected.to_bytes();
    assert_eq!(data.get_u8(), 0, "not compressed");
    assert_eq!(data.get_u32() as usize, data.len(), "exactly one message");
    Ok(R::decode(data).unwrap())
}

/// What a test compares between the listener and the in-process service: the decision, or the
/// code and reason of the error.
fn outcome<R>(answer: &Result<R, Status>, decision: impl Fn(&R) -> i32) -> (i32, String) {
    match answer {
        Ok(response) => (decision(response), String::new()),
        Err(status) => (-(status.code() as i32), reason(status)),
    }
}

/// A guard's whole cycle, and its refusals, through the listener and in process side by side
/// (each on its own agent): grant, a second ask while the lease is live, changed arguments,
/// Complete, the replay with its receipt, a Complete with a wrong token, Release of the
/// completed action, and a path the gate does not serve.
async fn in_process_answers_as_the_listener(kind: Kind) {
    let backend = backend(kind).await;
    let gate = Gate::new(backend.store.clone(), Default::default());
    let options = defaults::server();
    let local = InProcess::new(&gate, &options);
    let served = TestGate::serve_gate(backend, gate, options).await;
    let mut wire = served.client().await;
    let decision = |r: &pb::RequestTokenResponse| r.decision;

    let ask = |agent: &str, amount: u32| pb::RequestTokenRequest {
        idempotency_key: "invoice-1".into(),
        ..token_request(
            agent,
            "run-1",
            "payments.transfer",
            &format!(r#"{{"amount":{amount}}}"#),
        )
    };
    let granted_wire = wire
        .request_token(ask("wire", 5))
        .await
        .map(|r| r.into_inner());
    let granted_local: Result<pb::RequestTokenResponse, _> =
        call(&local, "RequestToken", &ask("local", 5), None).await;
    assert_eq!(
        outcome(&granted_local, decision),
        outcome(&granted_wire, decision)
    );
    assert_eq!(
        granted_local.as_ref().unwrap().decision(),
        pb::Decision::Granted
    );

    let again_wire = wire
        .request_token(ask("wire", 5))
        .await
        .map(|r| r.into_inner());
    let again_local = call(&local, "RequestToken", &ask("local", 5), None).await;
    assert_eq!(
        outcome(&again_local, decision),
        outcome(&again_wire, decision)
    );

    let changed_wire = wire
        .request_token(ask("wire", 6))
        .await
        .map(|r| r.into_inner());
    let changed_local = call(&local, "RequestToken", &ask("local", 6), None).await;
    assert_eq!(
        outcome(&changed_local, decision),
        outcome(&changed_wire, decision)
    );
    expect_error(
        changed_local.as_ref().unwrap_err(),
        Code::FailedPrecondition,
        "IDEMPOTENCY_KEY_REUSED",
    );

    let complete = |granted: &pb::RequestTokenResponse, token: Option<&str>| pb::CompleteRequest {
        action: granted.action.clone(),
        token: token.map_or_else(
            || granted.grant.as_ref().unwrap().token.clone(),
            str::to_owned,
        ),
        receipt: br#"{"transfer_id":"tr-1"}"#.to_vec(),
    };
    let (granted_wire, granted_local) = (granted_wire.unwrap(), granted_local.unwrap());
    let wrong_wire = wire
        .complete(complete(&granted_wire, Some("not-the-token")))
        .await
        .map(|r| r.into_inner());
    let wrong_local: Result<pb::CompleteResponse, _> = call(
        &local,
        "Complete",
        &complete(&granted_local, Some("not-the-token")),
        None,
    )
    .await;
    let recorded = |r: &pb::CompleteResponse| i32::from(r.completion.is_some());
    assert_eq!(
        outcome(&wrong_local, recorded),
        outcome(&wrong_wire, recorded)
    );
    assert!(wrong_local.is_err());

    let done_wire = wire
        .complete(complete(&granted_wire, None))
        .await
        .map(|r| r.into_inner());
    let done_local: Result<pb::CompleteResponse, _> =
        call(&local, "Complete", &complete(&granted_local, None), None).await;
    assert_eq!(
        outcome(&done_local, recorded),
        outcome(&done_wire, recorded)
    );

    let replay_wire = wire
        .request_token(ask("wire", 5))
        .await
        .map(|r| r.into_inner());
    let replay_local = call(&local, "RequestToken", &ask("local", 5), None).await;
    assert_eq!(
        outcome(&replay_local, decision),
        outcome(&replay_wire, decision)
    );
    let replay_local = replay_local.unwrap();
    assert_eq!(replay_local.decision(), pb::Decision::AlreadyCompleted);
    assert_eq!(
        replay_local.completion.unwrap().receipt,
        br#"{"transfer_id":"tr-1"}"#
    );

    let unknown: Result<pb::RequestTokenResponse, _> =
        call(&local, "NoSuchMethod", &ask("local", 5), None).await;
    assert_eq!(unknown.unwrap_err().code(), Code::Unimplemented);
}
on_stores!(in_process_answers_as_the_listener: embedded, redis);

/// With principals configured, an in-process caller shows its API key as a remote one does: none
/// is refused, the worker's key is let through for its own agents only.
#[tokio::test]
async fn in_process_asks_for_the_listeners_credentials() {
    let backend = backend(Kind::Embedded).await;
    let file = config(&principals_toml(""));
    let gate = Gate::new(backend.store.clone(), file.policies);
    let options = ServerOptions {
        principals: file.principals,
        ..defaults::server()
    };
    let local = InProcess::new(&gate, &options);
    let ask = token_request("billing-7", "run-1", "payments.transfer", r#"{"amount":5}"#);

    let anonymous: Result<pb::RequestTokenResponse, _> =
        call(&local, "RequestToken", &ask, None).await;
    expect_error(
        &anonymous.unwrap_err(),
        Code::Unauthenticated,
        "UNAUTHENTICATED",
    );

    let worker: pb::RequestTokenResponse = call(&local, "RequestToken", &ask, Some(WORKER_KEY))
        .await
        .unwrap();
    assert_eq!(worker.decision(), pb::Decision::Granted);

    let elsewhere = token_request("support-1", "run-1", "payments.transfer", r#"{"amount":5}"#);
    let refused: Result<pb::RequestTokenResponse, _> =
        call(&local, "RequestToken", &elsewhere, Some(WORKER_KEY)).await;
    expect_error(
        &refused.unwrap_err(),
        Code::PermissionDenied,
        "FORBIDDEN_SCOPE",
    );
    drop(backend);
}
