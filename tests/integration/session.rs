//! `Session`: RequestToken and Complete as messages of one stream (docs/CONTRACT.md, Session).
//! Each call answers as its unary method does, errors included; concurrent calls on one session
//! race as separate callers do; the stream's credentials and the caller's rate limit hold per
//! call; and a draining gate ends its open sessions instead of waiting for them.

use std::collections::HashMap;

use oncegate_config::ConfigFile;
use oncegate_proto::{
    self as pb, action_gate_service_client::ActionGateServiceClient, session_request::Call,
    session_response::Result as Answer,
};
use tempfile::TempDir;
use tokio::sync::mpsc;
use tokio_stream::{StreamExt as _, wrappers::ReceiverStream};
use tonic::{Code, Status, Streaming, transport::Channel};
use tonic_types::StatusExt as _;

use crate::support::{
    Kind, LoggedGate, RedisServer, TestGate, WORKER_KEY, authed, backend_with_server, config,
    connect, expect_error, on_stores, principals_toml, reason, token_request,
};

/// An open session: where to send calls, and the answers as they come.
struct Session {
    calls: mpsc::Sender<pb::SessionRequest>,
    answers: Streaming<pb::SessionResponse>,
}

impl Session {
    async fn open(client: &mut ActionGateServiceClient<Channel>, key: Option<&str>) -> Self {
        Self::try_open(client, key).await.unwrap()
    }

    async fn try_open(
        client: &mut ActionGateServiceClient<Channel>,
        key: Option<&str>,
    ) -> Result<Self, Status> {
        let (calls, outgoing) = mpsc::channel(256);
        let answers = client
            .session(authed(ReceiverStream::new(outgoing), key))
            .await?
            .into_inner();
        Ok(Session { calls, answers })
    }

    async fn send(&self, id: u64, call: Option<Call>) {
        let request = pb::SessionRequest {
            id,
            timeout: None,
            call,
        };
        self.calls.send(request).await.unwrap();
    }

    /// The next answer: its id, and the reply or the status a unary call would have failed with.
    async fn next(&mut self) -> (u64, Result<Answer, Status>) {
        let response = self.answers.next().await.unwrap().unwrap();
        let answer = match response.result.unwrap() {
            Answer::Error(e) => Err(Status::with_details(
                Code::from_i32(e.code),
                e.message,
                e.details.into(),
            )),
            answer => Ok(answer),
        };
        (response.id, answer)
    }

    /// Sends one call and waits for its answer (nothing else in flight).
    async fn call(&mut self, id: u64, call: Call) -> Result<Answer, Status> {
        self.send(id, Some(call)).await;
        let (answered, answer) = self.next().await;
        assert_eq!(answered, id);
        answer
    }
}

fn token_reply(answer: Result<Answer, Status>) -> pb::RequestTokenResponse {
    match answer {
        Ok(Answer::RequestToken(reply)) => reply,
        other => panic!("not a RequestToken reply: {other:?}"),
    }
}

/// A grant, its refusal to a second caller, a Complete and the replay, each as the unary calls
/// answer them; then a message without a call.
async fn a_sessions_calls_answer_as_the_unary_calls_do(kind: Kind) {
    let gate = TestGate::start(kind).await;
    let mut client = gate.client().await;
    let mut session = Session::open(&mut client, None).await;
    let request = token_request("agent", "run", "payments.transfer", r#"{"amount":10}"#);

    let granted = token_reply(session.call(1, Call::RequestToken(request.clone())).await);
    assert_eq!(granted.decision(), pb::Decision::Granted);
    let grant = granted.grant.clone().unwrap();

    // The same action asked again, unary and on the session: the same refusal, details included.
    let unary = client.request_token(request.clone()).await.unwrap_err();
    let on_session = session
        .call(2, Call::RequestToken(request.clone()))
        .await
        .unwrap_err();
    let unary_metadata = expect_error(&unary, Code::Aborted, "IDEMPOTENCY_IN_PROGRESS");
    let metadata = expect_error(&on_session, Code::Aborted, "IDEMPOTENCY_IN_PROGRESS");
    assert_eq!(
        metadata.keys().collect::<Vec<_>>(),
        unary_metadata.keys().collect::<Vec<_>>()
    );
    assert!(on_session.get_error_details().retry_info().is_some());

    let complete = pb::CompleteRequest {
        action: granted.action.clone(),
        token: grant.token.clone(),
        receipt: br#"{"paid":true}"#.to_vec(),
    };
    let completed = match session.call(3, Call::Complete(complete)).await {
        Ok(Answer::Complete(reply)) => reply.completion.unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(completed.receipt, br#"{"paid":true}"#);

    let replayed = token_reply(session.call(4, Call::RequestToken(request.clone())).await);
    let unary = client.request_token(request).await.unwrap().into_inner();
    assert_eq!(replayed.decision(), pb::Decision::AlreadyCompleted);
    assert_eq!(replayed, unary, "the session's replay is the unary one");

    session.send(5, None).await;
    let (id, answer) = session.next().await;
    assert_eq!(id, 5);
    expect_error(
        &answer.unwrap_err(),
        Code::InvalidArgument,
        "INVALID_REQUEST",
    );

    // A wrong token: refused, and the session goes on.
    let wrong = pb::CompleteRequest {
        action: granted.action,
        token: "not-the-token".into(),
        receipt: b"{}".to_vec(),
    };
    let refused = session.call(6, Call::Complete(wrong)).await.unwrap_err();
    assert!(
        ["TOKEN_MISMATCH", "COMPLETED_BY_OTHER"].contains(&reason(&refused).as_str()),
        "{refused:?}"
    );
}

on_stores!(a_sessions_calls_answer_as_the_unary_calls_do: embedded, redis, postgres);

/// A call's `timeout` is its deadline, as `grpc-timeout` is a unary call's: one that passes before
/// the gate answers (its Redis paused for a second, well inside the store's own timeout) ends the
/// call `DEADLINE_EXCEEDED`, and the session goes on.
#[tokio::test]
async fn a_calls_timeout_on_a_session_is_its_deadline() {
    let server = RedisServer::start();
    let redis = redis::Client::open(server.url()).unwrap();
    let backend = backend_with_server(server).await;
    let gate = TestGate::serve(backend, ConfigFile::default()).await;
    let mut client = gate.client().await;
    let mut session = Session::open(&mut client, None).await;
    let request = token_request("agent", "run", "payments.transfer", r#"{"amount":1}"#);

    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1000)
        .arg("ALL")
        .query_async(&mut conn)
        .await
        .unwrap();
    let late = pb::SessionRequest {
        id: 1,
        timeout: Some(prost_types::Duration {
            seconds: 0,
            nanos: 200_000_000,
        }),
        call: Some(Call::RequestToken(request.clone())),
    };
    session.calls.send(late).await.unwrap();
    let (id, answer) = session.next().await;
    assert_eq!(id, 1);
    let status = answer.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status
            .message()
            .contains("may or may not have taken effect"),
        "{status:?}"
    );

    // The session goes on: the same request, without a deadline, once Redis runs again. The
    // paused grant may have gone through meanwhile (it was sent): then this one is refused.
    let answer = session.call(2, Call::RequestToken(request)).await;
    match answer {
        Ok(Answer::RequestToken(reply)) => assert_eq!(reply.decision(), pb::Decision::Granted),
        Err(status) => assert_eq!(reason(&status), "IDEMPOTENCY_IN_PROGRESS", "{status:?}"),
        Ok(other) => panic!("{other:?}"),
    }
}

/// Many calls for one action in flight on one session at once, and many more on other sessions:
/// exactly one grant, every other caller `IDEMPOTENCY_IN_PROGRESS`, every id answered once.
async fn racing_calls_on_sessions_get_one_grant(kind: Kind) {
    const SESSIONS: usize = 4;
    const CALLS: u64 = 40;
    let gate = TestGate::start(kind).await;
    let request = token_request("agent", "run", "payments.transfer", r#"{"race":1}"#);
    let mut racers = Vec::new();
    for _ in 0..SESSIONS {
        let addr = gate.addr.to_string();
        let request = request.clone();
        racers.push(tokio::spawn(async move {
            let mut client = connect(&addr).await;
            let mut session = Session::open(&mut client, None).await;
            for id in 0..CALLS {
                session
                    .send(id, Some(Call::RequestToken(request.clone())))
                    .await;
            }
            let mut answered = HashMap::new();
            for _ in 0..CALLS {
                let (id, answer) = session.next().await;
                let outcome = match answer {
                    Ok(Answer::RequestToken(reply)) => format!("{:?}", reply.decision()),
                    Ok(other) => panic!("{other:?}"),
                    Err(status) => reason(&status),
                };
                assert!(
                    answered.insert(id, outcome).is_none(),
                    "id {id} answered twice"
                );
            }
            answered
        }));
    }
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    for racer in racers {
        let answered = racer.await.unwrap();
        assert_eq!(answered.len(), CALLS as usize);
        for outcome in answered.into_values() {
            *outcomes.entry(outcome).or_default() += 1;
        }
    }
    assert_eq!(outcomes.get("Granted"), Some(&1), "{outcomes:?}");
    assert_eq!(
        outcomes.get("IDEMPOTENCY_IN_PROGRESS"),
        Some(&(SESSIONS * CALLS as usize - 1)),
        "{outcomes:?}"
    );
}

on_stores!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] racing_calls_on_sessions_get_one_grant: embedded, redis, postgres);

/// A session opens only with credentials, and each of its calls takes one from the caller's
/// rate limit: a call over it is refused `RATE_LIMITED` and the session goes on.
#[tokio::test]
async fn a_session_takes_credentials_once_and_the_rate_limit_per_call() {
    let policies = config(&principals_toml("rate_limit_per_second = 0.001\nburst = 3"));
    let gate = TestGate::start_with(Kind::Embedded, policies).await;
    let mut client = gate.client().await;

    let refused = Session::try_open(&mut client, None).await;
    expect_error(
        &refused.err().expect("a session without credentials"),
        Code::Unauthenticated,
        "UNAUTHENTICATED",
    );

    // The opening takes one of the 3, the next two calls the rest.
    let mut session = Session::open(&mut client, Some(WORKER_KEY)).await;
    let request = |agent: &str, i: u32| {
        Call::RequestToken(token_request(
            agent,
            "run",
            "payments.transfer",
            &format!(r#"{{"i":{i}}}"#),
        ))
    };
    let reply = token_reply(session.call(1, request("billing-1", 1)).await);
    assert_eq!(reply.decision(), pb::Decision::Granted);
    // The stream's principal is the one checked against each call's scope.
    let status = session.call(2, request("payroll-1", 2)).await.unwrap_err();
    expect_error(&status, Code::PermissionDenied, "FORBIDDEN_SCOPE");
    for i in 3..=4 {
        let status = session
            .call(u64::from(i), request("billing-1", i))
            .await
            .unwrap_err();
        expect_error(&status, Code::ResourceExhausted, "RATE_LIMITED");
    }
}

/// SIGTERM with a session open and idle: the gate ends the session `UNAVAILABLE` and exits well
/// before its drain deadline, instead of waiting for the caller to close the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_open_sessions_and_the_gate_drains() {
    let dir = TempDir::new().unwrap();
    let mut gate = LoggedGate::start(
        &dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--serving-threads",
            "2",
            "--drain-seconds",
            "60",
        ],
    );
    let mut sessions = Vec::new();
    for i in 0..3u64 {
        let mut client = connect(&gate.addr).await;
        let mut session = Session::open(&mut client, None).await;
        let request = token_request("a", "r", "x", &format!(r#"{{"i":{i}}}"#));
        let reply = token_reply(session.call(i, Call::RequestToken(request)).await);
        assert_eq!(reply.decision(), pb::Decision::Granted);
        sessions.push((client, session));
    }
    let status = tokio::task::spawn_blocking(move || {
        let status = gate.terminate();
        (status, gate.log())
    });
    for (_client, session) in &mut sessions {
        let ended = session.answers.next().await.unwrap().unwrap_err();
        assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
        assert!(ended.message().contains("draining"), "{ended:?}");
    }
    let (status, log) = status.await.unwrap();
    assert!(status.success(), "{status:?}: {log}");
    // A gate that waited for its sessions would have waited out its deadline, and said so.
    assert!(!log.contains("drain deadline passed"), "{log}");
}
