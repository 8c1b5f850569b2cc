//! The PostgreSQL store's own behaviour, beside the contract it shares with the other stores
//! (conformance, rows, races... run on it too): its test servers, its schema's versions, its
//! purge, what it says about durability, and the start-up failures an operator must be told how
//! to fix. Faults under load are in `failures`, unreadable rows in `corrupt`.

use tempfile::TempDir;

use oncegate_store::{Store, postgres::schema};

use oncegate_gate::policy::Policies;

use crate::support::{
    Kind, LoggedGate, PgServer, TestGate, backend, complete, grant, postgres::fresh_database,
    postgres_backend, serve_to_exit, token_request,
};

/// A test server starts, is killed (a crash) and recovers what it had committed.
#[test]
fn a_test_server_starts_is_killed_and_recovers() {
    let mut server = PgServer::start();
    server.psql("postgres", "CREATE TABLE t (v int); INSERT INTO t VALUES (7)");
    server.kill();
    server.restart();
    assert_eq!(server.psql("postgres", "SELECT v FROM t"), "7");
}

/// `oncegate serve` on `args`, to its exit (blocking, off the runtime).
async fn serve_exit(args: Vec<String>) -> (Option<i32>, String) {
    tokio::task::spawn_blocking(move || serve_to_exit(&args))
        .await
        .unwrap()
}

fn db_of(url: &str) -> String {
    url.rsplit('/').next().unwrap().to_owned()
}

/// A database another (newer) gate migrated past this binary's schema is refused at start-up,
/// with a message saying so, and nothing is written to it: not even this binary's own tables.
#[tokio::test]
async fn a_schema_newer_than_the_binary_is_refused_and_nothing_is_written() {
    let url = tokio::task::spawn_blocking(fresh_database).await.unwrap();
    let server = crate::support::postgres::shared();
    let db = db_of(&url);
    let newer = schema::binary_version() + 1;
    server.psql(
        &db,
        &format!(
            "CREATE TABLE {} (version int4 PRIMARY KEY, name varchar(255), \
             applied_on varchar(255), checksum varchar(255)); \
             INSERT INTO {0} VALUES ({newer}, 'from_the_future', '', '0')",
            schema::HISTORY
        ),
    );
    let (code, stderr) = serve_exit(vec!["--postgres-url".into(), url]).await;
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "schema version {newer} is newer than this binary's {}",
            schema::binary_version()
        )) && stderr.contains("upgrade oncegate or point it at another database"),
        "{stderr}"
    );
    assert_eq!(
        server.psql(&db, "SELECT to_regclass('oncegate_records') IS NULL"),
        "t",
        "no table of this binary's was created"
    );
    assert_eq!(
        server.psql(&db, &format!("SELECT count(*) FROM {}", schema::HISTORY)),
        "1"
    );
}

/// The migrations are applied once, at the first start; the next start finds them applied.
#[tokio::test]
async fn migrations_are_applied_once() {
    let url = tokio::task::spawn_blocking(fresh_database).await.unwrap();
    let db = db_of(&url);
    let first = postgres_backend(url.clone(), None).await;
    let again = postgres_backend(url, None).await;
    let server = crate::support::postgres::shared();
    assert_eq!(
        server.psql(
            &db,
            &format!("SELECT max(version), count(*) FROM {}", schema::HISTORY)
        ),
        format!("{}|{}", schema::binary_version(), schema::binary_version())
    );
    drop((first, again));
}

/// The purge forgets settled records past their retention, a bounded batch at a time, and never
/// an unresolved one: the step wrote no expiry for it.
#[tokio::test]
async fn the_purge_forgets_expired_records_in_bounded_batches_and_keeps_unresolved_ones() {
    let backend = backend(Kind::Postgres).await;
    let url = backend.postgres.clone().unwrap();
    let gate = TestGate::serve(backend, Policies::default()).await;
    let mut client = gate.client().await;
    let done = token_request("agent", "run", "payments.transfer", r#"{"amount":1,"to":"a"}"#);
    let (action, granted) = grant(&mut client, done).await;
    complete(&mut client, &action, &granted.token, b"ok")
        .await
        .unwrap();
    let open = token_request("agent", "run", "payments.transfer", r#"{"amount":2,"to":"b"}"#);
    grant(&mut client, open).await;

    let server = crate::support::postgres::shared();
    let db = db_of(&url);
    assert_eq!(
        server.psql(
            &db,
            "SELECT count(*) FILTER (WHERE expires_at IS NULL), \
             count(*) FILTER (WHERE expires_at IS NOT NULL) FROM oncegate_records"
        ),
        "1|1",
        "the authorized record has no expiry, the completed one has"
    );
    // 600 copies of each, the completed ones already past their expiry.
    server.psql(
        &db,
        "INSERT INTO oncegate_records (key, agent, record, lease_at, expires_at) \
         SELECT r.key || int4send(n), r.agent, r.record, r.lease_at, \
                CASE WHEN r.expires_at IS NULL THEN NULL ELSE 1 END \
         FROM oncegate_records r, generate_series(1, 600) n",
    );
    let Store::Postgres(store) = &gate.backend.store else {
        unreachable!()
    };
    let first = store.purge_once(256).await.unwrap();
    assert_eq!(first.records, 256, "one pass removes one batch");
    let mut passes = 1;
    while store.purge_once(256).await.unwrap().records > 0 {
        passes += 1;
    }
    assert_eq!(passes, 3, "600 expired rows take three batches of 256");
    assert_eq!(
        server.psql(
            &db,
            "SELECT count(*) FILTER (WHERE expires_at IS NULL), count(*) FROM oncegate_records"
        ),
        "601|602",
        "every unresolved record is kept, and the live completed one"
    );
}

/// The start-up line says what a commit promises, read from the server; a durability level the
/// server does not promise is refused, naming the setting to change.
#[tokio::test]
async fn the_start_up_line_says_what_a_commit_promises_and_a_level_it_cannot_give_is_refused() {
    let url = tokio::task::spawn_blocking(fresh_database).await.unwrap();
    let dir = TempDir::new().unwrap();
    let args = ["--postgres-url", url.as_str(), "--listen", "127.0.0.1:0"];
    let gate = {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let dir_path = dir.path().to_owned();
        tokio::task::spawn_blocking(move || {
            let dir = TempDir::new_in(dir_path).unwrap();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            (LoggedGate::serve(&dir, &args), dir)
        })
        .await
        .unwrap()
    };
    let log = gate.0.log();
    let line = log
        .lines()
        .find(|l| l.contains("store ready"))
        .unwrap_or_else(|| panic!("no start-up durability line: {log}"));
    assert!(
        line.contains("synchronous_commit = on") && line.contains("no synchronous standby"),
        "{line}"
    );

    let (code, stderr) = serve_exit(vec![
        "--postgres-url".into(),
        url.clone(),
        "--durability-replicas".into(),
        "1".into(),
    ])
    .await;
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("synchronous_standby_names") && stderr.contains("--durability-replicas"),
        "{stderr}"
    );

    let unsafe_server = tokio::task::spawn_blocking(|| PgServer::start_with(&["synchronous_commit = off"]))
        .await
        .unwrap();
    let (code, stderr) = serve_exit(vec![
        "--postgres-url".into(),
        unsafe_server.url(),
        "--durability-replicas".into(),
        "1".into(),
    ])
    .await;
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("synchronous_commit = on"), "{stderr}");
}

/// Wrong URL, no server, missing database, wrong password, Redis beside it: the exit code and a
/// message that names what to fix.
#[tokio::test]
async fn bad_postgres_settings_exit_with_what_to_fix() {
    let server = tokio::task::spawn_blocking(|| {
        let mut server = PgServer::start();
        server.psql("postgres", "CREATE ROLE app LOGIN PASSWORD 'right'");
        let hba = "local all all trust\n\
                   host all postgres 127.0.0.1/32 trust\n\
                   host all all 127.0.0.1/32 scram-sha-256\n";
        std::fs::write(server.data_dir().join("pg_hba.conf"), hba).unwrap();
        server.reconfigure(&[]);
        server
    })
    .await
    .unwrap();
    let port = server.port;
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (
            vec!["--postgres-url".into(), "postgresql://h:notaport/db".into()],
            64,
            "--postgres-url",
        ),
        (
            vec![
                "--postgres-url".into(),
                format!("postgresql://postgres@127.0.0.1:{}/postgres", crate::support::free_port()),
            ],
            69,
            "check the host and port",
        ),
        (
            vec![
                "--postgres-url".into(),
                format!("postgresql://postgres@127.0.0.1:{port}/nosuchdb"),
            ],
            69,
            "the database does not exist",
        ),
        (
            vec![
                "--postgres-url".into(),
                format!("postgresql://app:wrong@127.0.0.1:{port}/postgres"),
            ],
            69,
            "password authentication failed",
        ),
        (
            vec![
                "--postgres-url".into(),
                server.url(),
                "--redis-url".into(),
                "redis://127.0.0.1:1".into(),
            ],
            64,
            "either --postgres-url or a Redis topology",
        ),
    ];
    for (args, want, says) in cases {
        let (code, stderr) = serve_exit(args.clone()).await;
        assert_eq!(code, Some(want), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
