//! The Redis scripts run as one Functions library (`crates/store/src/redis/library.rs`): a node
//! that lost it (a restart without persistence, `FUNCTION FLUSH`, a new Cluster master) gets it
//! again from the next call, which then succeeds; a Redis the gate cannot load it into is named
//! at start-up.

use oncegate_proto as pb;

use crate::support::{
    Kind, RedisServer, TestGate, on_stores, serve_to_exit, token_request, topology::query,
};

/// The oncegate libraries a node holds (`FUNCTION LIST`), by name.
fn libraries(port: u16) -> Vec<String> {
    let listed: redis::Value = query(port, redis::cmd("FUNCTION").arg("LIST")).unwrap();
    let text = format!("{listed:?}");
    text.split('"')
        .filter(|s| s.starts_with("oncegate_"))
        .map(String::from)
        .collect()
}

async fn a_node_that_lost_the_library_gets_it_from_the_next_call(kind: Kind) {
    let gate = TestGate::start(kind).await;
    let mut client = gate.client().await;
    let req = token_request("agent", "run", "payments.transfer", r#"{"amount":5}"#);
    let granted = client
        .request_token(req.clone())
        .await
        .unwrap()
        .into_inner();
    let ports = gate.backend.data_ports();
    let library = ports
        .iter()
        .map(|&p| libraries(p))
        .find(|l| !l.is_empty())
        .expect("the gate loaded its library");
    assert_eq!(library.len(), 1, "{library:?}");
    for &port in &ports {
        // A replica refuses FUNCTION FLUSH (READONLY); its master's flush reaches it.
        let _ = query::<()>(port, redis::cmd("FUNCTION").arg("FLUSH").arg("SYNC"));
    }
    assert!(
        ports.iter().all(|&p| libraries(p).is_empty()),
        "flushed everywhere"
    );

    let completed = client
        .complete(pb::CompleteRequest {
            action: granted.action.clone(),
            token: granted.grant.unwrap().token,
            receipt: b"sent".to_vec(),
        })
        .await
        .expect("the call loads the library again and runs")
        .into_inner();
    assert_eq!(completed.completion.unwrap().receipt, b"sent");
    let replay = client.request_token(req).await.unwrap().into_inner();
    assert_eq!(replay.decision(), pb::Decision::AlreadyCompleted);
    assert_eq!(replay.completion.unwrap().receipt, b"sent");
    assert!(
        ports.iter().any(|&p| libraries(p) == library),
        "the same library is back"
    );
}
on_stores!(a_node_that_lost_the_library_gets_it_from_the_next_call: redis, cluster, sentinel);

#[tokio::test]
async fn a_redis_user_not_allowed_function_load_is_named_at_start() {
    let redis = RedisServer::start();
    let _: () = query(
        redis.port,
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("gate")
            .arg("on")
            .arg(">s3cret")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg("-function"),
    )
    .unwrap();
    let url = format!("redis://gate:s3cret@127.0.0.1:{}", redis.port);
    let (code, stderr) =
        tokio::task::spawn_blocking(move || serve_to_exit(&["--redis-url", url.as_str()]))
            .await
            .unwrap();
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("FUNCTION LOAD") && stderr.contains("FCALL") && stderr.contains("7.0"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("s3cret"),
        "no password in the log: {stderr}"
    );
}

/// A grant's record is packed as a MessagePack array (every slot set: cheaper for Redis to pack
/// and unpack than the map a record with unset slots packs as); a record stored as a map, as
/// gates before this one stored every grant, is read and settled as before.
async fn a_record_stored_as_a_map_is_read_as_before(kind: Kind) {
    let gate = TestGate::start(kind).await;
    let mut client = gate.client().await;
    let req = token_request("agent", "run", "payments.transfer", r#"{"amount":5}"#);
    let granted = client
        .request_token(req.clone())
        .await
        .unwrap()
        .into_inner();
    let port = gate.backend.data_ports()[0];
    let records: Vec<String> = query::<Vec<String>>(port, redis::cmd("KEYS").arg("og:{*}:*"))
        .unwrap()
        .into_iter()
        .filter(|k| !k.ends_with(":leases") && !k.ends_with(":receipts"))
        .collect();
    let [record] = records.as_slice() else {
        panic!("one record: {records:?}")
    };
    let packed: Vec<u8> = query(port, redis::cmd("GET").arg(record)).unwrap();
    assert_eq!(packed[0], 0xdc, "a grant is an array of 16 or more slots");
    // Unset the slots gates before this one left unset: the record packs as a map again.
    let repacked: Vec<u8> = query(
        port,
        redis::cmd("EVAL")
            .arg(
                "local r = cmsgpack.unpack(redis.call('GET', KEYS[1])) \
                 r[19], r[20], r[21], r[22] = nil, nil, nil, nil \
                 redis.call('SET', KEYS[1], cmsgpack.pack(r), 'KEEPTTL') \
                 return redis.call('GET', KEYS[1])",
            )
            .arg(1)
            .arg(record),
    )
    .unwrap();
    assert_eq!(repacked[0], 0xde, "stored as a map of 16 or more entries");

    let completed = client
        .complete(pb::CompleteRequest {
            action: granted.action.clone(),
            token: granted.grant.unwrap().token,
            receipt: b"sent".to_vec(),
        })
        .await
        .expect("the map is read as the record it is")
        .into_inner();
    assert_eq!(completed.completion.unwrap().receipt, b"sent");
    let replay = client.request_token(req).await.unwrap().into_inner();
    assert_eq!(replay.decision(), pb::Decision::AlreadyCompleted);
    assert_eq!(replay.completion.unwrap().receipt, b"sent");
}
on_stores!(a_record_stored_as_a_map_is_read_as_before: redis);
