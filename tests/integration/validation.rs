//! Refused input, through real gRPC on every store: each malformed field of a RequestToken is
//! refused with INVALID_REQUEST naming that field (and a BadRequest violation), and creates nothing;
//! strict mode refuses actions no policy names.

use oncegate_proto as pb;
use tonic::Code;
use tonic_types::StatusExt;

use crate::support::{
    Kind, TestGate, complete, expect_error, grant, on_stores, policies, state, token_request,
};

async fn bad_input_is_refused_and_creates_nothing(kind: Kind) {
    let gate = TestGate::start(kind).await;
    let client = &mut gate.client().await;
    let long = "x".repeat(257);
    let deep = format!(
        "{}1{}",
        r#"{"a":"#.to_owned() + &"[".repeat(32),
        "]".repeat(32) + "}"
    );
    let big = format!(r#"{{"a":"{}"}}"#, "x".repeat(64 * 1024));
    type Mutation = Box<dyn Fn(&mut pb::RequestTokenRequest)>;
    let cases: Vec<(&str, Mutation)> = vec![
        (
            "scope.agent_id",
            Box::new(|r| r.scope.as_mut().unwrap().agent_id.clear()),
        ),
        (
            "scope.run_id",
            Box::new(move |r| r.scope.as_mut().unwrap().run_id = "y".repeat(257)),
        ),
        ("action", Box::new(|r| r.action.clear())),
        ("action", Box::new(move |r| r.action = long.clone())),
        (
            "params_json",
            Box::new(|r| r.params_json = "not json".into()),
        ),
        ("params_json", Box::new(|r| r.params_json = "[1,2]".into())),
        (
            "params_json",
            Box::new(|r| r.params_json = r#"{"a":1,"a":2}"#.into()),
        ),
        (
            "params_json",
            Box::new(|r| r.params_json = r#"{"amount":9007199254740993}"#.into()),
        ),
        (
            "params_json",
            Box::new(move |r| r.params_json = deep.clone()),
        ),
        (
            "params_json",
            Box::new(move |r| r.params_json = big.clone()),
        ),
        (
            "lease_ttl",
            Box::new(|r| {
                r.lease_ttl = Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 0,
                })
            }),
        ),
        (
            "lease_ttl",
            Box::new(|r| {
                r.lease_ttl = Some(prost_types::Duration {
                    seconds: -5,
                    nanos: 0,
                })
            }),
        ),
        (
            "lease_ttl",
            Box::new(|r| {
                r.lease_ttl = Some(prost_types::Duration {
                    seconds: 90_000,
                    nanos: 0,
                })
            }),
        ),
        ("scope", Box::new(|r| r.scope = None)),
    ];
    for (field, mutate) in cases {
        let mut req = token_request("agent", "run-bad", "x", r#"{"a":1}"#);
        mutate(&mut req);
        let status = client.request_token(req).await.unwrap_err();
        let meta = expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");
        assert_eq!(meta["field"], field, "{status:?}");
        let violations = status
            .get_error_details()
            .bad_request()
            .unwrap()
            .field_violations
            .clone();
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].field, field);
    }
    // Exactly at the limits is fine; nothing of the refused requests was created.
    let ok = token_request("agent", "run-bad", "x", r#"{"a":1}"#);
    let (action, g) = grant(client, ok).await;
    assert!(g.fencing > 0);
    let status = complete(client, &action, &g.token, &vec![0u8; 64 * 1024 + 1])
        .await
        .unwrap_err();
    let meta = expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");
    assert_eq!(meta["field"], "receipt");
    assert_eq!(
        state(client, &action).await.state(),
        pb::ActionState::Authorized
    );
}
on_stores!(bad_input_is_refused_and_creates_nothing: embedded, redis, cluster, sentinel, postgres);

async fn strict_mode_refuses_actions_without_policy(kind: Kind) {
    let strict = policies("strict = true\n[actions.\"known\"]\n");
    let gate = TestGate::start_with(kind, strict).await;
    let mut client = gate.client().await;
    let status = client
        .request_token(token_request("a", "r", "unknown", "{}"))
        .await
        .unwrap_err();
    let meta = expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");
    assert_eq!(meta["field"], "action");
    grant(&mut client, token_request("a", "r", "known", "{}")).await;
}
on_stores!(strict_mode_refuses_actions_without_policy: embedded, redis, postgres);
