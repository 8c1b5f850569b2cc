//! Signed grants over gRPC on every store: the statement a grant carries verifies with the gate's
//! public keys against the params it was granted for (Rust client's `verify_grant`), names the
//! policy's audience (or the action), carries the grant's fencing number and provider key, and is
//! refused for changed params, another audience, or once tampered with. A redelivered grant gets a
//! fresh statement; a replay carries none.

use oncegate_client::verify_grant;
use oncegate_proto::{self as pb};

use crate::support::{
    Kind, TestGate, complete, config, grant, on_stores, test_signer, token_request,
};

const POLICY: &str = r#"
[actions."payments.transfer"]
key_fields = ["/amount", "/to"]
audience = "fake-bank"
"#;
const FIELDS: [&str; 2] = ["/amount", "/to"];
const PARAMS: &str = r#"{"amount":100,"to":"DE89","memo":"invoice 1"}"#;

async fn grants_carry_a_statement_an_executor_verifies(kind: Kind) {
    let signer = test_signer();
    let keys = signer.public_keys().clone();
    let gate = TestGate::start_signed(kind, config(POLICY), signer).await;
    let mut client = gate.client().await;
    let mut req = token_request("billing", "run-1", "payments.transfer", PARAMS);
    req.idempotency_key = "inv-1".into();
    req.holder = "w1".into();
    let (action, granted) = grant(&mut client, req.clone()).await;

    let claims = verify_grant(&keys, &granted.statement, PARAMS, &FIELDS, "fake-bank").unwrap();
    assert_eq!(claims.fencing, granted.fencing);
    assert_eq!(claims.provider_key, granted.provider_key);
    assert_eq!(
        (claims.agent.as_str(), claims.run.as_str()),
        ("billing", "run-1")
    );
    assert_eq!(
        (claims.key.as_str(), claims.action.as_str()),
        ("inv-1", "payments.transfer")
    );
    assert_eq!(claims.iss, "oncegate-test");
    assert_eq!(
        claims.exp,
        granted.lease_expires_at.unwrap().seconds,
        "the statement ends with the lease"
    );
    // The memo is not a key field: a rewritten memo is the same grant.
    let memo = r#"{"to":"DE89","amount":100.0,"memo":"rewritten"}"#;
    verify_grant(&keys, &granted.statement, memo, &FIELDS, "fake-bank").unwrap();
    for (params, audience, kind) in [
        (
            r#"{"amount":900,"to":"DE89"}"#,
            "fake-bank",
            "fingerprint_mismatch",
        ),
        (PARAMS, "other-bank", "wrong_audience"),
    ] {
        let refused = verify_grant(&keys, &granted.statement, params, &FIELDS, audience);
        assert_eq!(refused.unwrap_err().kind(), kind);
    }
    let mut tampered = granted.statement.clone();
    tampered.insert(tampered.len() / 2, 'A');
    assert!(verify_grant(&keys, &tampered, PARAMS, &FIELDS, "fake-bank").is_err());

    // The same holder asking again (a lost reply) gets the same grant and a statement that
    // verifies; a replay after Complete carries the completion, not a grant statement.
    let again = client
        .request_token(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(again.redelivered);
    let statement = &again.grant.unwrap().statement;
    assert_eq!(
        verify_grant(&keys, statement, PARAMS, &FIELDS, "fake-bank")
            .unwrap()
            .fencing,
        granted.fencing
    );
    complete(&mut client, &action, &granted.token, b"tx-1")
        .await
        .unwrap();
    let replay = client.request_token(req).await.unwrap().into_inner();
    assert_eq!(replay.decision(), pb::Decision::AlreadyCompleted);
    assert!(replay.grant.is_none());

    // No policy audience: the action's name.
    let (_, other) = grant(
        &mut client,
        token_request("billing", "run-1", "email.send", "{}"),
    )
    .await;
    verify_grant(&keys, &other.statement, "{}", &[], "email.send").unwrap();
}
on_stores!(grants_carry_a_statement_an_executor_verifies: embedded, redis, cluster, postgres);

#[tokio::test]
async fn an_unsigned_gate_hands_out_no_statement() {
    let gate = TestGate::start(Kind::Embedded).await;
    let mut client = gate.client().await;
    let (_, granted) = grant(&mut client, token_request("a", "r", "x", "{}")).await;
    assert!(granted.statement.is_empty());
    let keys = test_signer().public_keys().clone();
    let refused = verify_grant(&keys, &granted.statement, "{}", &[], "x").unwrap_err();
    assert_eq!(
        refused.kind(),
        "malformed",
        "an executor that verifies fails closed"
    );
}

/// The `intent` claim is the request's `intent_id` as sent, `""` when it had none, and the
/// fingerprint the statement vouches for hashes `""` as `"intent": null` (docs/CONTRACT.md §4.x):
/// it is the gate's own fingerprint of the request, which an executor recomputes from the claim.
#[tokio::test]
async fn the_intent_claim_is_empty_without_an_intent_and_hashed_as_null() {
    use sha2::{Digest, Sha256};
    let signer = test_signer();
    let keys = signer.public_keys().clone();
    let gate = TestGate::start_signed(Kind::Embedded, config(""), signer).await;
    let mut client = gate.client().await;
    for intent in ["", "invoice-41#2"] {
        let mut req = token_request("billing", "run-1", "email.send", "{}");
        req.intent_id = intent.into();
        let reply = client.request_token(req).await.unwrap().into_inner();
        let statement = &reply.grant.as_ref().unwrap().statement;
        let claims = verify_grant(&keys, statement, "{}", &[], "email.send").unwrap();
        assert_eq!(claims.intent, intent);
        assert_eq!(claims.fingerprint, reply.fingerprint);
        let hashed = if intent.is_empty() {
            "null".to_owned()
        } else {
            format!("{intent:?}")
        };
        let canonical = format!(r#"{{"action":"email.send","intent":{hashed},"params":{{}}}}"#);
        let expected = format!("v1-{}", hex::encode(Sha256::digest(canonical.as_bytes())));
        assert_eq!(claims.fingerprint, expected, "{canonical}");
    }
}
