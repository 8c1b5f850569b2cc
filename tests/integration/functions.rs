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

/// A function whose reply is packed (`library.rs`'s `Reply::Packed`) tells the gate what the same
/// Lua value would have said as RESP: each value below is returned both ways by a real Redis and
/// the packed one, unpacked, must equal the RESP one.
#[test]
fn a_packed_reply_unpacks_to_what_redis_would_have_sent() {
    let redis = RedisServer::start();
    let port = redis.port;
    let cases = [
        "{ 1700000000123, 'granted', 1, 'tok', 1700000000123001, 0, 1 }",
        "{ -1, -200, -40000, -3000000000, 127, 128, 255, 256, 65535, 65536, 4294967296 }",
        "{ 2^53, -(2^53), 1.5, -2.7, 0.25, 1e300 * 0 }",
        "{ true, false, '', 'text' }",
        "{}",
        "{ {}, { {} }, { 1, { 2, { 3, { 'deep' } } } } }",
        "{ 1, nil, 3 }",
        "{ 1, 2, x = 3 }",
        "{ a = 1, b = 2 }",
        "{ [2] = 'two', [3] = 'three' }",
        "{ string.rep('x', 31), string.rep('y', 32), string.rep('z', 300), string.rep('w', 70000) }",
        r"{ '\0\1\255 binary \r\n', string.char(0xc1, 0xff, 0x80) }",
        "(function() local t = {} for i = 1, 70000 do t[i] = i end return t end)()",
        "(function() local t = {} for i = 1, 20 do t[i] = { i, tostring(i) } end return t end)()",
        "'a string'",
        "42",
    ];
    for case in cases {
        let resp: redis::Value = query(
            port,
            redis::cmd("EVAL").arg(format!("return {case}")).arg(0),
        )
        .unwrap();
        let packed: redis::Value = query(
            port,
            redis::cmd("EVAL")
                .arg(format!("return cmsgpack.pack({case})"))
                .arg(0),
        )
        .unwrap();
        let redis::Value::BulkString(packed) = packed else {
            panic!("{case}: cmsgpack.pack gave {packed:?}");
        };
        let unpacked =
            oncegate_store::redis::unpacked(&packed).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(unpacked, resp, "{case}");
    }
    for corrupt in [
        &b""[..],
        b"\x93\x01",
        b"\xc1",
        b"\x01\x02",
        b"\xdd\xff\xff\xff\xff",
    ] {
        assert!(
            oncegate_store::redis::unpacked(corrupt).is_err(),
            "{corrupt:?} is not a packed reply"
        );
    }
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
