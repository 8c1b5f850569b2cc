use super::*;

fn shared() -> Shared {
    Shared {
        name: "gate".into(),
        sentinels: Vec::new(),
        options: crate::redis::test_options(),
        resolving: tokio::sync::Mutex::new(()),
        state: Mutex::new(State::default()),
    }
}

#[test]
fn a_started_failover_fails_calls_closed_until_the_switch() {
    let s = shared();
    s.on_event("+try-failover", "master other 127.0.0.1 6379");
    assert!(s.current().is_ok(), "another master's failover is not ours");
    s.on_event("+try-failover", "master gate 127.0.0.1 6379");
    assert!(
        s.current().is_err(),
        "fail closed while Sentinel fails over"
    );
    s.on_event("+switch-master", "other 127.0.0.1 6379 127.0.0.1 6380");
    assert!(
        s.current().is_err(),
        "another master's switch does not end ours"
    );
    s.on_event("+switch-master", "gate 127.0.0.1 6379 127.0.0.1 6380");
    assert!(
        matches!(s.current(), Ok(None)),
        "resolve again after the switch"
    );
}

#[test]
fn an_answer_from_a_master_no_longer_trusted_fails_closed() {
    let s = shared();
    assert!(!s.trusts(0), "no master resolved: nothing is trusted");
    s.on_event("+try-failover", "master gate 127.0.0.1 6379");
    assert!(
        !s.trusts(0),
        "a failover started: the old master's answers are not trusted"
    );
    s.on_event("+switch-master", "gate 127.0.0.1 6379 127.0.0.1 6380");
    assert!(!s.trusts(0), "the master was switched");
}

#[test]
fn an_aborted_failover_resumes() {
    let s = shared();
    s.on_event("+try-failover", "master gate 127.0.0.1 6379");
    s.on_event("-failover-abort-not-elected", "master gate 127.0.0.1 6379");
    assert!(matches!(s.current(), Ok(None)));
}

#[test]
fn errors_that_distrust_the_master() {
    let readonly = RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
        "READONLY",
    ));
    assert!(must_reresolve(&readonly));
    let script = RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
        "x",
    ));
    assert!(!must_reresolve(&script));
}
