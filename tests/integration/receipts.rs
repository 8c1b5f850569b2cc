//! Receipt chains on every store: concurrent completions of one agent's actions (workers and an
//! operator) form one gapless chain that verifies, each completion carrying its place (replays
//! too), only heads signed; another agent has its own chain. A chain entry rewritten directly in
//! Redis, or in the embedded store's file, is named by the verification; entries recorded after
//! the last signed head (a gate stopped before sealing them) are unsigned yet, not tampered; a
//! signer that panics while sealing a Redis chain panics its caller and stores nothing.

use std::{sync::Arc, time::Duration};

use redb::ReadableTable as _;

use oncegate_domain::{
    ActionKey,
    statement::receipt::{ChainEntry, ReceiptCore, verify_chain},
};
use oncegate_proto::{self as pb, gate_admin_service_client::GateAdminServiceClient};
use oncegate_store::{
    Receipts, Store,
    embedded::{EmbeddedStore, system_clock},
    redis::{RedisOptions, RedisStore, keys},
};
use tonic::transport::Channel;

use crate::support::{
    Kind, OPS_KEY, STORE_TIMEOUT, TestGate, authed, complete_as, config, grant_as, on_stores,
    principals_toml, store_request, test_signer, token_request,
};

/// Every entry of `agent`'s chain, read a page of 5 at a time through ExportReceipts.
async fn export(admin: &mut GateAdminServiceClient<Channel>, agent: &str) -> Vec<ChainEntry> {
    let (mut entries, mut after) = (Vec::new(), 0);
    loop {
        let page = admin
            .export_receipts(authed(
                pb::ExportReceiptsRequest {
                    agent_id: agent.into(),
                    after_seq: after,
                    page_size: 5,
                },
                Some(OPS_KEY),
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(!page.jwks.is_empty());
        for e in page.entries {
            let action = e.action.clone().unwrap();
            let scope = action.scope.unwrap();
            let at = e.completed_at.unwrap();
            entries.push(ChainEntry {
                core: ReceiptCore {
                    seq: e.seq,
                    agent: scope.agent_id,
                    run: scope.run_id,
                    key: action.key,
                    fingerprint: e.fingerprint.clone(),
                    receipt_digest: e.receipt_digest.clone(),
                    fencing: e.fencing,
                    source: if e.source() == pb::CompletionSource::Operator {
                        "operator"
                    } else {
                        "worker"
                    }
                    .into(),
                    completed_at: at.seconds * 1000 + i64::from(at.nanos) / 1_000_000,
                },
                statement: e.statement,
            });
        }
        match page.next_after_seq {
            0 => return entries,
            next => after = next,
        }
    }
}

async fn completions_form_one_chain_per_agent(kind: Kind) {
    let signer = test_signer();
    let keys = signer.public_keys().clone();
    let gate = TestGate::start_signed(kind, config(&principals_toml("")), signer).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..12 {
        let mut client = gate.client().await;
        tasks.spawn(async move {
            let mut req = token_request("billing-a", "run-1", "pay", &format!(r#"{{"n":{i}}}"#));
            req.idempotency_key = format!("k{i}");
            let resp = client
                .request_token(authed(req, Some(OPS_KEY)))
                .await
                .unwrap()
                .into_inner();
            let grant = resp.grant.unwrap();
            let done = client
                .complete(authed(
                    pb::CompleteRequest {
                        action: resp.action,
                        token: grant.token,
                        receipt: format!("tx-{i}").into_bytes(),
                    },
                    Some(OPS_KEY),
                ))
                .await
                .unwrap()
                .into_inner()
                .completion
                .unwrap();
            (done.seq, done.statement)
        });
    }
    let channel = Channel::from_shared(format!("http://{}", gate.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut admin = GateAdminServiceClient::new(channel);
    let external = admin
        .record_external_completion(authed(
            pb::RecordExternalCompletionRequest {
                receipt_format: pb::ReceiptFormat::Text as i32,
                action: Some(pb::ActionRef {
                    scope: Some(pb::Scope {
                        agent_id: "billing-a".into(),
                        run_id: "run-1".into(),
                    }),
                    key: "by-hand".into(),
                }),
                receipt: b"wired by phone".to_vec(),
                note: "ticket 7".into(),
                action_name: "pay".into(),
                params_json: r#"{"n":99}"#.into(),
                intent_id: String::new(),
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap()
        .into_inner()
        .completion
        .unwrap();
    let mut answered = vec![(external.seq, external.statement)];
    while let Some(done) = tasks.join_next().await {
        answered.push(done.unwrap());
    }
    let mut client = gate.client().await;
    let mut other = token_request("billing-b", "run-1", "pay", "{}");
    other.idempotency_key = "b1".into();
    let (action, grant) = grant_as(&mut client, other.clone(), Some(OPS_KEY)).await;
    complete_as(&mut client, &action, &grant.token, b"b", Some(OPS_KEY))
        .await
        .unwrap();

    let chain = export(&mut admin, "billing-a").await;
    let report = verify_chain(&keys, "billing-a", &chain);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(
        (report.verified, report.unsigned.len(), chain.len()),
        (13, 0, 13),
        "the export sealed the chain: every entry is covered by a signed head"
    );
    let heads = chain.iter().filter(|e| !e.statement.is_empty()).count();
    assert!(
        (1..=13).contains(&heads) && !chain[12].statement.is_empty(),
        "{heads} heads, the last entry one of them"
    );
    let mut seqs: Vec<u64> = answered.iter().map(|a| a.0).collect();
    seqs.sort();
    assert_eq!(
        seqs,
        (1..=13).collect::<Vec<_>>(),
        "each completion got its own place"
    );
    assert!(
        answered.iter().all(|(_, statement)| statement.is_empty()),
        "a completion's reply carries no receipt statement: its head is signed with its commit"
    );
    assert!(
        chain
            .iter()
            .any(|e| e.core.source == "operator" && e.core.key == "by-hand")
    );
    // A replay carries the completion's place.
    let mut again = token_request("billing-a", "run-1", "pay", r#"{"n":3}"#);
    again.idempotency_key = "k3".into();
    let replay = client
        .request_token(authed(again, Some(OPS_KEY)))
        .await
        .unwrap()
        .into_inner();
    let replayed = replay.completion.unwrap();
    assert_eq!(chain[replayed.seq as usize - 1].core.key, "k3");
    // Another agent has a chain of its own.
    let b = export(&mut admin, "billing-b").await;
    assert_eq!(b.len(), 1);
    assert!(verify_chain(&keys, "billing-b", &b).problems.is_empty());
}
on_stores!(#[tokio::test(flavor = "multi_thread", worker_threads = 4)] completions_form_one_chain_per_agent: embedded, redis, cluster, postgres);

/// Grants and completes `n` actions of agent `a` directly on a store, chaining with `signer`.
async fn complete_directly(store: &Store, signer: &Receipts, n: usize) {
    complete_more(store, signer, 0, n).await;
}

/// Grants and completes actions `k<from>` … `k<to - 1>` of agent `a` directly on a store.
async fn complete_more(store: &Store, signer: &Receipts, from: usize, to: usize) {
    for i in from..to {
        let key = ActionKey::new("a", "r", format!("k{i}"));
        let req = store_request(&format!("v1-{i}"), &format!("t{i}"));
        store.request_token(&key, &req, 0).await.unwrap();
        let done = store
            .complete(&key, &req.new_token, b"ok", 0, Some(signer))
            .await
            .unwrap();
        assert_eq!(done.result.unwrap().completion.seq, i as u64 + 1);
    }
}

/// The verification's complaint about entry 2 of agent `a`'s chain on `store` (its only one).
async fn named_problem(store: &Store) -> String {
    let keys = test_signer().public_keys().clone();
    let chain = store.receipts("a", 0, 100).await.unwrap();
    let report = verify_chain(&keys, "a", &chain);
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert_eq!(report.problems[0].seq, 2, "{:?}", report.problems);
    assert_eq!(report.problems[0].key, "k1");
    report.problems[0].what.clone()
}

#[tokio::test]
async fn an_entry_rewritten_in_redis_is_named() {
    let backend = crate::support::backend(Kind::Redis).await;
    let signer: Receipts = test_signer();
    complete_directly(&backend.store, &signer, 3).await;
    backend.store.seal_receipts("a", &signer).await.unwrap();
    let keys = test_signer().public_keys().clone();
    assert!(
        verify_chain(
            &keys,
            "a",
            &backend.store.receipts("a", 0, 100).await.unwrap()
        )
        .problems
        .is_empty()
    );
    // Someone with write access to Redis rewrites entry 2's receipt digest.
    let client = redis::Client::open(backend.redis.as_ref().unwrap().url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let list = keys::receipts("a");
    let raw: Vec<u8> = redis::cmd("LINDEX")
        .arg(&list)
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut entry: (u64, String, String, String, u64, u8, i64, String) =
        rmp_serde::from_slice(&raw).unwrap();
    entry.3 = "0".repeat(64);
    let forged = rmp_serde::to_vec(&entry).unwrap();
    let () = redis::cmd("LSET")
        .arg(&list)
        .arg(1)
        .arg(forged)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Entry 2 is a head (sealed on its own) or covered by entry 3's head: named either way.
    let what = named_problem(&backend.store).await;
    assert!(
        what.contains("differs from its signed statement") || what.contains("rewritten"),
        "{what}"
    );
}

#[tokio::test]
async fn an_entry_rewritten_in_the_embedded_file_is_named() {
    let dir = tempfile::TempDir::new().unwrap();
    let signer: Receipts = test_signer();
    {
        let store = Store::Embedded(
            EmbeddedStore::open(dir.path(), system_clock(), STORE_TIMEOUT).unwrap(),
        );
        complete_directly(&store, &signer, 3).await;
    }
    // The writer thread lets go of the file once its last handle is gone.
    let path = dir.path().join("oncegate.redb");
    let db = loop {
        match redb::Database::open(&path) {
            Ok(db) => break db,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let table: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("receipts");
    let txn = db.begin_write().unwrap();
    {
        let mut receipts = txn.open_table(table).unwrap();
        let mut entry_key = 1u32.to_be_bytes().to_vec();
        entry_key.extend_from_slice(b"a");
        entry_key.extend_from_slice(&2u64.to_be_bytes());
        let raw = receipts
            .get(entry_key.as_slice())
            .unwrap()
            .unwrap()
            .value()
            .to_vec();
        let (mut core, statement, digest): (ReceiptCore, String, String) =
            rmp_serde::from_slice(&raw).unwrap();
        assert!(
            !statement.is_empty(),
            "each Complete was a group commit of its own"
        );
        core.fencing += 1;
        let forged = rmp_serde::to_vec(&(core, statement, digest)).unwrap();
        receipts
            .insert(entry_key.as_slice(), forged.as_slice())
            .unwrap();
    }
    txn.commit().unwrap();
    drop(db);
    let store =
        Store::Embedded(EmbeddedStore::open(dir.path(), system_clock(), STORE_TIMEOUT).unwrap());
    assert!(
        named_problem(&store)
            .await
            .contains("differs from its signed statement")
    );
    let _ = Arc::clone(&signer);
}

/// On Redis a gate that stops before its next seal leaves the entries after the last signed head
/// unsigned: the verification reports them as unsigned yet, not as tampered, and still names a
/// rewritten entry that a head covers; the next seal (any gate) covers them all.
#[tokio::test]
async fn entries_after_the_last_signed_head_are_unsigned_yet_not_tampered() {
    let options = RedisOptions {
        // This store's sealing task never gets to run: it stands for a gate that stopped.
        seal_interval: Duration::from_secs(3600),
        ..crate::support::test_options()
    };
    let backend = crate::support::backend_with(Kind::Redis, options).await;
    let signer: Receipts = test_signer();
    let keys = test_signer().public_keys().clone();
    complete_directly(&backend.store, &signer, 2).await;
    backend.store.seal_receipts("a", &signer).await.unwrap();
    complete_more(&backend.store, &signer, 2, 5).await;
    assert_eq!(verified(&backend.store).await, (2, vec![3, 4, 5], vec![]));

    // Another gate seals the chain (its agent's next completion, or an export): one head covers
    // the three.
    let other = backend_store_again(&backend).await;
    other.seal_receipts("a", &signer).await.unwrap();
    assert_eq!(verified(&other).await, (5, vec![], vec![]));
    let chain = other.receipts("a", 0, 100).await.unwrap();
    let heads: Vec<u64> = chain
        .iter()
        .filter(|e| !e.statement.is_empty())
        .map(|e| e.core.seq)
        .collect();
    assert_eq!(heads, vec![2, 5]);

    // Entry 4, covered by entry 5's head, rewritten in Redis: named exactly.
    let client = redis::Client::open(backend.redis.as_ref().unwrap().url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let list = keys::receipts("a");
    let raw: Vec<u8> = redis::cmd("LINDEX")
        .arg(&list)
        .arg(3)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut entry: (u64, String, String, String, u64, u8, i64, String) =
        rmp_serde::from_slice(&raw).unwrap();
    entry.4 += 1;
    let () = redis::cmd("LSET")
        .arg(&list)
        .arg(3)
        .arg(rmp_serde::to_vec(&entry).unwrap())
        .query_async(&mut conn)
        .await
        .unwrap();
    let report = verify_chain(&keys, "a", &other.receipts("a", 0, 100).await.unwrap());
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert_eq!(
        (report.problems[0].seq, report.problems[0].key.as_str()),
        (4, "k3")
    );
    assert!(report.problems[0].what.contains("rewritten"));
}

/// A head signature that panics while a Redis chain is sealed (off the calls' thread, on the
/// blocking pool) comes back as that panic to whoever sealed, not as a store error that would
/// hide it; nothing was stored, so the entries stay unsigned, and the next seal covers them.
#[tokio::test]
async fn a_panic_while_sealing_comes_back_as_itself_and_stores_nothing() {
    struct Panicking;
    impl oncegate_domain::statement::receipt::ReceiptSigner for Panicking {
        fn sign_head(&self, _: &ReceiptCore, _: &str, _: Vec<String>) -> String {
            panic!("the signer broke");
        }
    }
    let options = RedisOptions {
        // Only this test seals.
        seal_interval: Duration::from_secs(3600),
        ..crate::support::test_options()
    };
    let backend = crate::support::backend_with(Kind::Redis, options).await;
    let signer: Receipts = test_signer();
    complete_directly(&backend.store, &signer, 3).await;

    let store = backend.store.clone();
    let sealing = tokio::spawn(async move {
        let panicking: Receipts = Arc::new(Panicking);
        store.seal_receipts("a", &panicking).await
    });
    let panic = sealing
        .await
        .expect_err("the seal panics")
        .try_into_panic()
        .expect("a panic, not a cancellation");
    assert_eq!(panic.downcast_ref::<&str>(), Some(&"the signer broke"));

    assert_eq!(verified(&backend.store).await, (0, vec![1, 2, 3], vec![]));
    backend.store.seal_receipts("a", &signer).await.unwrap();
    assert_eq!(verified(&backend.store).await, (3, vec![], vec![]));
}

/// Agent `a`'s chain on `store` as a verifier sees it: the entries a signed head covers, the seqs
/// of the unsigned ones after the last head, and what does not hold.
async fn verified(store: &Store) -> (usize, Vec<u64>, Vec<String>) {
    let keys = test_signer().public_keys().clone();
    let report = verify_chain(&keys, "a", &store.receipts("a", 0, 100).await.unwrap());
    let problems = report.problems.into_iter().map(|p| p.what).collect();
    (report.verified, report.unsigned, problems)
}

/// A second handle on the backend's Redis, as another gate would have.
async fn backend_store_again(backend: &crate::support::Backend) -> Store {
    let url = backend.redis.as_ref().unwrap().url();
    Store::Redis(
        RedisStore::connect(&url, crate::support::test_options())
            .await
            .unwrap(),
    )
}
