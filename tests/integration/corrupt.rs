//! A stored record the embedded store cannot read is that action's failure, not the store's: its
//! calls answer INTERNAL (the store's `Corrupt`) and write nothing, every other action is served,
//! and the writer goes on (it used to stop for good).

use std::time::{Duration, Instant};

use oncegate_domain::{ActionKey, ledger::TokenOutcome};
use oncegate_gate::{Gate, TokenAnswer, TokenCall, policy::Policies};
use oncegate_proto as pb;
use oncegate_store::{
    Store,
    embedded::{EmbeddedStore, system_clock},
};
use redb::{ReadableDatabase as _, ReadableTable as _, TableDefinition};
use tonic::Code;

use crate::support::{Backend, TestGate, complete, expect_error, grant, token_request};

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");

fn open(dir: &std::path::Path) -> Store {
    Store::Embedded(EmbeddedStore::open(dir, system_clock(), Duration::from_secs(5)).unwrap())
}

/// Opens the redb file once the writer thread of a dropped store has let it go.
fn take_file(path: &std::path::Path) -> redb::Database {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match redb::Database::open(path) {
            Ok(db) => return db,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("the store never released {}: {e}", path.display()),
        }
    }
}

fn serve(store: Store) -> impl std::future::Future<Output = TestGate> {
    let backend = Backend {
        store: store.clone(),
        redis: None,
        cluster: None,
        sentinel: None,
        postgres: None,
        pg_server: None,
        _dir: None,
    };
    let gate = Gate::new(store, Policies::default());
    TestGate::serve_gate(backend, gate, oncegate_config::defaults::server())
}

#[tokio::test]
async fn an_unreadable_record_fails_its_action_and_the_store_serves_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let broken_request = token_request("billing", "r1", "pay", r#"{"amount":1}"#);
    let fine_request = token_request("billing", "r1", "pay", r#"{"amount":2}"#);
    let (broken, fine, broken_token, fine_token) = {
        // In process, so that no server task outlives this block with a handle on the store.
        let gate = Gate::new(open(dir.path()), Policies::default());
        let ask = |params: &str| TokenCall {
            agent_id: "billing".into(),
            run_id: "r1".into(),
            action: "pay".into(),
            params_json: params.into(),
            ..TokenCall::default()
        };
        let broken = gate.request_token(ask(r#"{"amount":1}"#)).await.unwrap();
        let fine = gate.request_token(ask(r#"{"amount":2}"#)).await.unwrap();
        let token = |answer: &TokenAnswer| match &answer.outcome {
            TokenOutcome::Granted(grant, _) => grant.token.clone(),
            other => panic!("{other:?}"),
        };
        let reference = |key: &ActionKey| pb::ActionRef {
            scope: Some(pb::Scope {
                agent_id: key.agent_id.clone(),
                run_id: key.run_id.clone(),
            }),
            key: key.key.clone(),
        };
        (
            reference(&broken.key),
            reference(&fine.key),
            token(&broken),
            token(&fine),
        )
    };
    // Every handle is gone: the writer checkpoints and lets the file go. Break one record.
    let path = dir.path().join("oncegate.redb");
    {
        let db = take_file(&path);
        let scope = broken.scope.clone().unwrap();
        let key = ActionKey::new(&scope.agent_id, &scope.run_id, &broken.key).encode();
        let txn = db.begin_write().unwrap();
        {
            let mut records = txn.open_table(RECORDS).unwrap();
            assert!(
                records.get(key.as_slice()).unwrap().is_some(),
                "the record is there"
            );
            records
                .insert(key.as_slice(), b"\xc1 not a record".as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
        let read = db.begin_read().unwrap();
        assert_eq!(
            read.open_table(RECORDS)
                .unwrap()
                .get(key.as_slice())
                .unwrap()
                .unwrap()
                .value(),
            b"\xc1 not a record"
        );
    }

    let gate = serve(open(dir.path())).await;
    let mut client = gate.client().await;
    // The broken action: every call on it is INTERNAL, and nothing is decided on it.
    let status = client
        .request_token(broken_request.clone())
        .await
        .unwrap_err();
    expect_error(&status, Code::Internal, "INTERNAL");
    let status = complete(&mut client, &broken, &broken_token, b"r")
        .await
        .unwrap_err();
    expect_error(&status, Code::Internal, "INTERNAL");
    let status = client
        .get_action(pb::GetActionRequest {
            action: Some(broken.clone()),
        })
        .await
        .unwrap_err();
    expect_error(&status, Code::Internal, "INTERNAL");

    // The others: the stored one completes and replays, a new one is granted, and the store is
    // still serving after the failures (the writer did not stop).
    let done = complete(&mut client, &fine, &fine_token, b"paid")
        .await
        .unwrap();
    assert_eq!(done.receipt, b"paid");
    let replay = client
        .request_token(fine_request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay.decision, pb::Decision::AlreadyCompleted as i32);
    let (_, new) = grant(
        &mut client,
        token_request("billing", "r1", "pay", r#"{"amount":3}"#),
    )
    .await;
    assert!(!new.token.is_empty());
    let status = client.request_token(broken_request).await.unwrap_err();
    expect_error(&status, Code::Internal, "INTERNAL");
    // ListUnresolved skips the record it cannot read (logged) and lists what it can.
    let listed = gate.backend.store.list_unresolved(None, None, 10).await;
    assert!(listed.is_ok(), "{:?}", listed.err());
}
