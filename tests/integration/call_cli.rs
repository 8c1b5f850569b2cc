//! The command line against a real `oncegate serve` process, as a newcomer and an operator meet
//! it: `oncegate call` (every worker RPC, text and JSON, exit codes), options after the
//! subcommand, an unreachable gate's cause, `admin complete`'s flags in its errors, what the
//! start-up log says, and the log lines (text and JSON) of a few decisions.

use std::process::Output;

use serde_json::Value;
use tempfile::TempDir;

use crate::support::{
    LoggedGate, OPS_KEY, WORKER_KEY, oncegate_command, principals_toml, write_file,
};

const PARAMS: &str = r#"{"amount":100,"currency":"EUR","to":"DE89"}"#;

/// `oncegate <args>` against `addr`, with `key` as the API key.
fn run(addr: &str, key: Option<&str>, args: &[&str]) -> Output {
    let mut command = oncegate_command();
    command
        .args(args)
        .env("ONCEGATE_TARGET", format!("http://{addr}"))
        .env("ONCEGATE_ADMIN_TARGET", format!("http://{addr}"))
        .env_remove("ONCEGATE_SERVER")
        .env_remove("ONCEGATE_API_KEY");
    if let Some(key) = key {
        command.env("ONCEGATE_API_KEY", key);
    }
    command.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)))
}

/// The value of `name` in `name  value` text output.
fn field(stdout: &str, name: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(name).filter(|rest| rest.starts_with(' ')))
        .unwrap_or_else(|| panic!("no {name} in\n{stdout}"))
        .trim()
        .to_owned()
}

fn request_token<'a>(run: &'a str, key: &'a str, params: &'a str) -> Vec<&'a str> {
    vec![
        "call",
        "request-token",
        "--agent",
        "billing-agent",
        "--run",
        run,
        "--action",
        "payments.transfer",
        "--params",
        params,
        "--idempotency-key",
        key,
    ]
}

#[test]
fn call_makes_every_worker_rpc_with_text_json_and_exit_codes() {
    let dir = TempDir::new().unwrap();
    let gate = LoggedGate::start(&dir, &["--listen", "127.0.0.1:0"]);
    let addr = gate.addr.as_str();

    // Granted: text, with the token, fencing and provider key.
    let out = run(addr, None, &request_token("r1", "inv-1", PARAMS));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let granted = text(&out.stdout);
    assert_eq!(field(&granted, "decision"), "DECISION_GRANTED");
    let token = field(&granted, "grant.token");
    let fencing = field(&granted, "grant.fencing");
    let provider_key = field(&granted, "grant.provider_key");
    assert!(provider_key.starts_with("og-"));

    // The options go after the subcommand too.
    let mut ask = request_token("r1", "inv-1", PARAMS);
    ask.push("--json");
    let again = run(addr, None, &ask);
    assert_eq!(again.status.code(), Some(1), "in progress is a refusal");
    let refusal = json(&again);
    assert_eq!(refusal["error"]["reason"], "IDEMPOTENCY_IN_PROGRESS");
    assert_eq!(refusal["error"]["code"], "ABORTED");
    assert!(refusal["error"]["retry_after_ms"].as_u64().unwrap() > 0);

    // Extend, get (the provider key; the token is operators' only), complete, replay.
    let action = ["--agent", "billing-agent", "--run", "r1", "--key", "inv-1"];
    let mut extend = vec!["call", "extend", "--token", &token, "--ttl-seconds", "60"];
    extend.extend(action);
    let out = run(addr, None, &extend);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("lease_expires_at"));
    let mut get = vec!["call", "get", "--json"];
    get.extend(action);
    let view = json(&run(addr, None, &get));
    assert_eq!(view["state"], "ACTION_STATE_AUTHORIZED");
    assert_eq!(view["provider_key"], provider_key.as_str());
    assert_eq!(view["token"], "", "an agent never sees the token");
    let mut complete = vec!["call", "complete", "--token", &token, "--receipt", "tx_1"];
    complete.extend(action);
    let out = run(addr, None, &complete);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(field(&text(&out.stdout), "completion.receipt_text"), "tx_1");
    let replay = json(&run(addr, None, &ask));
    assert_eq!(replay["decision"], "DECISION_ALREADY_COMPLETED");
    assert_eq!(replay["completion"]["receipt_text"], "tx_1");
    assert_eq!(replay["completion"]["fencing"].to_string(), fencing);

    // A reused key: exit 1, the reason and the differing field on standard error.
    let out = run(
        addr,
        None,
        &request_token(
            "r1",
            "inv-1",
            r#"{"amount":900,"currency":"EUR","to":"DE89"}"#,
        ),
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("oncegate call: IDEMPOTENCY_KEY_REUSED (FAILED_PRECONDITION): "),
        "{stderr}"
    );
    assert!(
        stderr.contains("\n  differing_fields  /amount\n"),
        "{stderr}"
    );

    // Release after a definite failure; the next grant has a higher fencing number.
    let granted = text(&run(addr, None, &request_token("r2", "inv-2", PARAMS)).stdout);
    let token = field(&granted, "grant.token");
    let release = [
        "call",
        "release",
        "--agent",
        "billing-agent",
        "--run",
        "r2",
        "--key",
        "inv-2",
        "--token",
        &token,
        "--reason",
        "definite-failure",
    ];
    let out = run(addr, None, &release);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(field(&text(&out.stdout), "released"), "true");
    let regranted = text(&run(addr, None, &request_token("r2", "inv-2", PARAMS)).stdout);
    assert!(
        field(&regranted, "grant.fencing").parse::<u64>().unwrap()
            > field(&granted, "grant.fencing").parse::<u64>().unwrap()
    );

    // Bad flags are usage errors (64), before any call.
    let mut bad = request_token("r3", "inv-3", PARAMS);
    bad.extend(["--lease-seconds", "0"]);
    let out = run(addr, None, &bad);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("positive number of seconds"));
}

#[test]
fn an_unreachable_gate_prints_the_cause_and_exits_69() {
    let dir = TempDir::new().unwrap();
    // A port nothing listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    for args in [
        vec!["call", "get", "--agent", "a", "--run", "r", "--key", "k"],
        vec!["admin", "list-unresolved"],
    ] {
        let out = run(&addr, None, &args);
        assert_eq!(out.status.code(), Some(69), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!("cannot reach http://{addr}: "))
                && stderr.contains("Connection refused"),
            "{stderr}"
        );
    }
    let out = oncegate_command()
        .args([
            "call", "get", "--agent", "a", "--run", "r", "--key", "k", "--server",
        ])
        .arg("http://gate.invalid:1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(
        text(&out.stderr).contains("dns error"),
        "{}",
        text(&out.stderr)
    );
    drop(dir);
}

#[test]
fn admin_names_its_own_flags_and_the_start_up_log_names_the_config() {
    let dir = TempDir::new().unwrap();
    let config = write_file(
        dir.path(),
        "p.toml",
        &format!(
            "strict = true\n[actions.\"payments.transfer\"]\n[actions.\"email.*\"]\n{}",
            principals_toml("")
        ),
    );
    let config = config.to_str().unwrap();
    let gate = LoggedGate::start(&dir, &["--listen", "127.0.0.1:0", "--config", config]);
    let log = gate.log();
    assert!(
        log.contains(&format!(
            "config={config} policies=2 strict=true principals=2"
        )),
        "{log}"
    );

    // An action the gate never saw: the message names the flags, not the proto fields.
    let out = run(
        &gate.addr,
        Some(OPS_KEY),
        &[
            "admin",
            "complete",
            "--agent",
            "billing-1",
            "--run",
            "r",
            "--key",
            "k",
            "--receipt",
            "manual",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("give --action-name and --params") && !stderr.contains("params_json:"),
        "{stderr}"
    );
    // An agent's key may not call the operator API; `--json` after the subcommand works.
    let out = run(
        &gate.addr,
        Some(WORKER_KEY),
        &["admin", "list-unresolved", "--json"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out)["error"]["reason"], "FORBIDDEN_SCOPE");
}

#[test]
fn audit_lines_say_each_thing_once_and_json_logs_carry_the_rpc_span() {
    for format in ["text", "json"] {
        let dir = TempDir::new().unwrap();
        let gate = LoggedGate::start(&dir, &["--listen", "127.0.0.1:0", "--log-format", format]);
        let out = run(&gate.addr, None, &request_token("r1", "inv-1", PARAMS));
        assert_eq!(out.status.code(), Some(0));
        let out = run(
            &gate.addr,
            None,
            &request_token(
                "r1",
                "inv-1",
                r#"{"amount":900,"currency":"EUR","to":"DE89"}"#,
            ),
        );
        assert_eq!(out.status.code(), Some(1));
        let log = gate.log();
        let reused = log
            .lines()
            .find(|l| l.contains("oncegate::audit") && l.contains("key_reused"))
            .unwrap_or_else(|| panic!("no key_reused audit line in\n{log}"));
        assert!(!reused.contains("fencing"), "{reused}");
        if format == "text" {
            assert_eq!(reused.matches("billing-agent").count(), 1, "{reused}");
            assert_eq!(reused.matches("inv-1").count(), 1, "{reused}");
            assert_eq!(reused.matches("key_reused").count(), 1, "{reused}");
            // These lines used to run to 330 characters, saying agent, run and key twice; what is
            // left is the timestamp, the RPC span's fields and the decision's own.
            assert!(reused.len() <= 250, "{} characters: {reused}", reused.len());
            assert!(reused.contains("differing=/amount"), "{reused}");
            assert!(log.contains("grpc.code=\"FAILED_PRECONDITION\""), "{log}");
        } else {
            let event: Value = serde_json::from_str(reused).unwrap();
            assert_eq!(event["differing"], "/amount");
            assert_eq!(event.get("agent_id"), None, "said once, on the span");
            let span = &event["span"];
            assert_eq!(span["rpc"], "oncegate.v1.ActionGateService/RequestToken");
            assert_eq!(span["agent_id"], "billing-agent");
            assert_eq!(span["principal"], "anonymous");
            let finished: Vec<Value> = log
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|e| e["target"] == "oncegate::rpc")
                .collect();
            let codes: Vec<&str> = finished
                .iter()
                .map(|e| e["span"]["grpc.code"].as_str().unwrap())
                .collect();
            assert_eq!(codes, ["OK", "FAILED_PRECONDITION"], "{log}");
            assert!(finished.iter().all(|e| e["elapsed_ms"].is_number()));
        }
    }
}

/// Every address form reaches the gate, from `call` and `admin` alike: `host:port` (as
/// `oncegate.local`'s `server.target` prints it), `http://`, the admin socket as `unix:` and
/// `unix://`; a form it cannot take is refused (64) with the forms it wants, and so are TLS
/// without a CA and TLS files given to an `http://` address.
#[test]
fn every_address_form_reaches_the_gate_and_another_is_refused_with_the_forms() {
    let dir = TempDir::new().unwrap();
    let gate = LoggedGate::start(&dir, &["--listen", "127.0.0.1:0"]);
    let socket = dir.path().join("data/admin.sock");
    let socket = socket.to_str().unwrap();
    let get = ["call", "get", "--agent", "a", "--run", "r", "--key", "k"];
    let run_at = |server: &str, args: &[&str]| {
        oncegate_command()
            .args(args)
            .args(["--server", server])
            .env_remove("ONCEGATE_API_KEY")
            .output()
            .unwrap()
    };
    let bare = gate.addr.clone();
    for server in [
        bare.clone(),
        format!("http://{bare}"),
        format!("http://{bare}/"),
    ] {
        let out = run_at(&server, &get);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{server}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).contains("ACTION_STATE_ABSENT"),
            "{server}"
        );
    }
    for server in [format!("unix:{socket}"), format!("unix://{socket}")] {
        let out = run_at(&server, &["admin", "list-unresolved"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{server}: {}",
            text(&out.stderr)
        );
    }

    let forms = "give host:port, http://host:port, https://host:port (TLS) or unix:<path> \
                 (a gate's admin socket)";
    for server in [
        format!("grpc://{bare}"),
        "127.0.0.1".to_owned(),
        format!("dns:///{bare}"),
    ] {
        let out = run_at(&server, &get);
        assert_eq!(out.status.code(), Some(64), "{server}");
        assert_eq!(
            text(&out.stderr),
            format!("oncegate call: {server:?} is not a gate address: {forms}\n")
        );
    }
    let out = run_at(&format!("https://{bare}"), &get);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out.stderr).contains("TLS needs --ca"),
        "{}",
        text(&out.stderr)
    );
    let mut with_ca = get.to_vec();
    with_ca.extend(["--ca", "/nonexistent/ca.pem"]);
    let out = run_at(&format!("http://{bare}"), &with_ca);
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(
        text(&out.stderr),
        format!(
            "oncegate call: http://{bare} is plaintext, yet TLS files are given: give \
             https://{bare}\n"
        )
    );

    // `oncegate mcp --gate` reads the same forms: another is refused before it starts.
    let out = oncegate_command()
        .args([
            "mcp",
            "--gate",
            "grpc://127.0.0.1:1",
            "--upstream-command",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out.stderr).contains(&format!(
            "\"grpc://127.0.0.1:1\" is not a gate address: {forms}"
        )),
        "{}",
        text(&out.stderr)
    );
}

/// The environment names the worker's address (`ONCEGATE_TARGET`: `call`, `mcp --gate`) and the
/// operator's (`ONCEGATE_ADMIN_TARGET`: `admin`); the earlier names (`ONCEGATE_SERVER`,
/// `ONCEGATE_GATE`) are still read, each with one line naming the new one.
#[test]
fn the_environment_names_the_worker_and_the_operator_address_and_the_old_names_still_work() {
    let dir = TempDir::new().unwrap();
    let gate = LoggedGate::start(&dir, &["--listen", "127.0.0.1:0"]);
    let socket = format!("unix:{}", dir.path().join("data/admin.sock").display());
    let get = ["call", "get", "--agent", "a", "--run", "r", "--key", "k"];
    let with_env = |args: &[&str], env: &[(&str, &str)]| {
        let mut command = oncegate_command();
        command.args(args).current_dir(dir.path());
        for name in [
            "ONCEGATE_TARGET",
            "ONCEGATE_ADMIN_TARGET",
            "ONCEGATE_SERVER",
            "ONCEGATE_GATE",
            "ONCEGATE_API_KEY",
        ] {
            command.env_remove(name);
        }
        command.envs(env.iter().copied()).output().unwrap()
    };
    let ok = |out: &Output, warning: &str| {
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stderr), warning);
    };

    ok(&with_env(&get, &[("ONCEGATE_TARGET", &gate.addr)]), "");
    ok(
        &with_env(
            &["admin", "list-unresolved"],
            &[("ONCEGATE_ADMIN_TARGET", &socket)],
        ),
        "",
    );
    // Each command reads its own: the worker's address is not the operator's.
    let out = with_env(
        &["admin", "list-unresolved"],
        &[
            ("ONCEGATE_TARGET", "grpc://nowhere:1"),
            ("ONCEGATE_ADMIN_TARGET", &socket),
        ],
    );
    ok(&out, "");

    let server = format!("http://{}", gate.addr);
    ok(
        &with_env(&get, &[("ONCEGATE_SERVER", &server)]),
        "oncegate: ONCEGATE_SERVER is deprecated: set ONCEGATE_TARGET instead\n",
    );
    ok(
        &with_env(
            &["admin", "list-unresolved"],
            &[("ONCEGATE_SERVER", &socket)],
        ),
        "oncegate: ONCEGATE_SERVER is deprecated: set ONCEGATE_ADMIN_TARGET instead\n",
    );
    // The new name wins, and then the old one is not mentioned.
    ok(
        &with_env(
            &get,
            &[
                ("ONCEGATE_TARGET", &gate.addr),
                ("ONCEGATE_SERVER", "grpc://nowhere:1"),
            ],
        ),
        "",
    );

    // `oncegate mcp` reads ONCEGATE_TARGET, and ONCEGATE_GATE with the line: an address it cannot
    // take shows which one it read, before it starts.
    let mcp = ["mcp", "--upstream-command", "true"];
    let out = with_env(&mcp, &[("ONCEGATE_TARGET", "grpc://from-target:1")]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("\"grpc://from-target:1\" is not a gate address")
            && !stderr.contains("deprecated"),
        "{stderr}"
    );
    let out = with_env(&mcp, &[("ONCEGATE_GATE", "grpc://from-gate:1")]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("oncegate: ONCEGATE_GATE is deprecated: set ONCEGATE_TARGET instead\n")
            && stderr.contains("\"grpc://from-gate:1\" is not a gate address"),
        "{stderr}"
    );
}
