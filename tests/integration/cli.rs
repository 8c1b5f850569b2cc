//! The command line as a user meets it: `oncegate fingerprint`, `--help` (grouped and wrapped),
//! configuration errors, exit codes (a port in use, a Redis unreachable at start-up, threads the
//! system refuses), and the Makefile's `run` and `clean-data`.

use std::process::{Command, Stdio};

use tempfile::TempDir;

use crate::support::{
    free_port, oncegate_command, oncegate_without_threads, run_to_exit,
    serve_on_redis_without_threads, serve_to_exit, write_file,
};

fn oncegate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn fingerprint_prints_what_the_server_computes() {
    let a = oncegate(&[
        "fingerprint",
        "--action",
        "pay",
        "--params",
        r#"{"b":1,"a":2}"#,
    ]);
    let b = oncegate(&[
        "fingerprint",
        "--action",
        "pay",
        "--params",
        r#"{ "a": 2.0, "b": 1 }"#,
    ]);
    assert!(a.status.success());
    let fp = String::from_utf8(a.stdout).unwrap();
    assert_eq!(fp, String::from_utf8(b.stdout).unwrap());
    assert!(fp.trim().starts_with("v1-") && fp.trim().len() == 67);
}

#[test]
fn fingerprint_applies_policy_key_fields() {
    let dir = TempDir::new().unwrap();
    let config = write_file(
        dir.path(),
        "policy.toml",
        "[actions.\"pay\"]\nkey_fields = [\"/amount\"]\n",
    );
    let config = config.to_str().unwrap();
    let a = oncegate(&[
        "fingerprint",
        "--config",
        config,
        "--action",
        "pay",
        "--params",
        r#"{"amount":1,"memo":"a"}"#,
    ]);
    let b = oncegate(&[
        "fingerprint",
        "--config",
        config,
        "--action",
        "pay",
        "--params",
        r#"{"amount":1,"memo":"b"}"#,
    ]);
    assert!(a.status.success());
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn fingerprint_rejects_bad_params_with_a_reason() {
    let out = oncegate(&[
        "fingerprint",
        "--action",
        "pay",
        "--params",
        r#"{"a":1,"a":2}"#,
    ]);
    assert_eq!(out.status.code(), Some(65));
    assert!(String::from_utf8_lossy(&out.stderr).contains("repeat the member name"));
}

#[test]
fn bad_configuration_exits_64_with_a_clear_message() {
    let dir = TempDir::new().unwrap();
    let config = write_file(
        dir.path(),
        "bad.toml",
        "[defaults]\nlease_ttl_seconds = -1\n",
    );
    let (code, stderr) = serve_to_exit(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(64));
    assert!(stderr.contains("lease_ttl_seconds"), "{stderr}");
    let out = oncegate(&["serve", "--listen", "not-an-address"]);
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn help_documents_every_flag_with_its_environment_variable() {
    let out = oncegate(&["serve", "--help"]);
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--listen",
        "--redis-url",
        "--data-dir",
        "--config",
        "--log-format",
        "ONCEGATE_REDIS_URL",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
}

/// The help names authorization where a reader looks for it: what `--config` may hold (serve and
/// mcp), and the approval and budget commands in both command summaries.
#[test]
fn help_names_authorization_and_the_approval_commands() {
    let help = |args: &[&str]| {
        let out = oncegate(args);
        assert!(out.status.success(), "{args:?}");
        squeeze(&String::from_utf8(out.stdout).unwrap())
    };
    let serve = help(&["serve", "--help"]);
    let config = &serve[serve.find("--config <CONFIG>").unwrap()..];
    let config = &config[..config.find("[env: ONCEGATE_CONFIG=]").unwrap()];
    for table in [
        "[authorization]",
        "[[budgets]]",
        "[[principals]]",
        "[limits]",
        "[mcp]",
    ] {
        assert!(
            config.contains(table),
            "serve --config omits {table}: {config}"
        );
    }
    let mcp = help(&["mcp", "--help"]);
    let config = &mcp[mcp.find("--config <CONFIG>").unwrap()..];
    for table in ["[mcp]", "[authorization]", "[[budgets]]"] {
        assert!(
            config.contains(table),
            "mcp --config omits {table}: {config}"
        );
    }
    let top = help(&["--help"]);
    let admin = &top[top.find(" admin ").unwrap()..top.find(" bench ").unwrap()];
    let admin_help = help(&["admin", "--help"]);
    let admin_about = &admin_help[..admin_help.find("Usage:").unwrap()];
    for command in ["approve", "deny", "list-approvals", "budgets", "audit"] {
        assert!(
            admin.contains(command),
            "oncegate --help: admin omits {command}: {admin}"
        );
        assert!(
            admin_about.contains(command),
            "oncegate admin --help omits {command}: {admin_about}"
        );
        assert!(admin_help.contains(&format!(" {command} ")), "{admin_help}");
    }
    assert!(
        top.contains("[authorization]") && top.contains("[[budgets]]"),
        "{top}"
    );
}

/// `oncegate --help` and `oncegate admin --help` name every admin subcommand in their summary of
/// `admin`: the list is read from clap's own list of subcommands, so a new one must be named.
#[test]
fn the_admin_summary_names_every_admin_subcommand() {
    let raw = |args: &[&str]| {
        let out = oncegate(args);
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let admin_help = raw(&["admin", "--help"]);
    let commands: Vec<&str> = admin_help
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|command| *command != "help")
        .collect();
    assert!(
        commands.contains(&"webhooks") && commands.contains(&"console-login"),
        "{commands:?} read from {admin_help}"
    );
    let top = squeeze(&raw(&["--help"]));
    let summary = &top[top.find(" admin ").unwrap()..top.find(" bench ").unwrap()];
    let about = squeeze(&admin_help[..admin_help.find("Usage:").unwrap()]);
    for command in &commands {
        let named = |text: &str| {
            text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .any(|word| word == *command)
        };
        assert!(
            named(summary),
            "oncegate --help: admin omits {command}: {summary}"
        );
        assert!(
            named(&about),
            "oncegate admin --help omits {command}: {about}"
        );
    }
}

/// `text` with each run of white space as one space (help wraps at the terminal's width).
fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn redis_topology_is_validated_once_and_exits_64() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().to_str().unwrap();
    let policy = write_file(
        dir.path(),
        "p.toml",
        "[actions.\"pay\"]\ndurability_replicas = 1\n",
    );
    for (args, needle) in [
        (
            vec![
                "--redis-url",
                "redis://127.0.0.1:1",
                "--redis-cluster-nodes",
                "127.0.0.1:2",
            ],
            "only one of",
        ),
        (
            vec!["--redis-sentinels", "127.0.0.1:26379"],
            "--redis-sentinel-master",
        ),
        (vec!["--redis-sentinel-master", "m"], "go together"),
        (vec!["--durability-replicas", "1"], "needs Redis"),
        (
            vec!["--config", policy.to_str().unwrap()],
            "durability_replicas",
        ),
        (
            vec![
                "--redis-url",
                "redis://127.0.0.1:1",
                "--durability-timeout-ms",
                "3000",
            ],
            "below --store-timeout-ms",
        ),
    ] {
        let mut all = vec!["serve", "--listen", "127.0.0.1:0", "--data-dir", data];
        all.extend(args.iter().copied());
        let out = oncegate(&all);
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    // The environment counts like the flags.
    let out = Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir", data])
        .env("ONCEGATE_REDIS_URL", "redis://127.0.0.1:1")
        .env("ONCEGATE_REDIS_SENTINELS", "127.0.0.1:26379")
        .env("ONCEGATE_REDIS_SENTINEL_MASTER", "m")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn help_documents_the_topology_and_durability_flags() {
    let out = oncegate(&["serve", "--help"]);
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--redis-cluster-nodes",
        "ONCEGATE_REDIS_CLUSTER_NODES",
        "--redis-sentinels",
        "ONCEGATE_REDIS_SENTINELS",
        "--redis-sentinel-master",
        "ONCEGATE_REDIS_SENTINEL_MASTER",
        "--redis-username",
        "--redis-password",
        "--durability-replicas",
        "ONCEGATE_DURABILITY_REPLICAS",
        "--durability-timeout-ms",
        "--redis-sentinel-check-ms",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
}

#[test]
fn serve_help_is_grouped_and_wrapped() {
    let out = oncegate(&["serve", "--help"]);
    let help = String::from_utf8(out.stdout).unwrap();
    let headings: Vec<&str> = help
        .lines()
        .filter(|l| !l.starts_with(' ') && l.ends_with(':'))
        .collect();
    assert_eq!(
        headings,
        [
            "Options:",
            "Listener:",
            "Store:",
            "Redis topologies (set one; none: the embedded store):",
            "PostgreSQL (excludes the Redis topologies):",
            "Durability:",
            "Security:",
            "Observability:",
            "Limits (more in the config file's [limits]):",
        ],
        "{help}"
    );
    let widest = help.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(widest <= 100, "a help line of {widest} columns:\n{help}");
}

#[test]
fn a_quoted_number_of_seconds_says_what_is_expected() {
    let dir = TempDir::new().unwrap();
    let config = write_file(
        dir.path(),
        "p.toml",
        "[defaults]\nlease_ttl_seconds = \"5\"\n",
    );
    let (code, stderr) = serve_to_exit(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(64));
    assert!(
        stderr.contains("lease_ttl_seconds") && stderr.contains("expected a number of seconds"),
        "{stderr}"
    );
}

#[test]
fn a_port_in_use_exits_69() {
    let dir = TempDir::new().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = oncegate(&[
        "serve",
        "--listen",
        &addr,
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen"));
}

/// A Redis nobody listens on: exit 69 once the connection is refused (or the store timeout has
/// passed), with a message that names the address the gate tried.
#[test]
fn an_unreachable_redis_at_start_up_exits_69_naming_the_address() {
    let closed = format!("127.0.0.1:{}", free_port());
    let url = format!("redis://{closed}");
    let (code, stderr) = serve_to_exit(&["--redis-url", &url, "--store-timeout-ms", "2000"]);
    assert_eq!(code, Some(69), "{stderr}");
    assert!(stderr.contains("cannot open the store"), "{stderr}");
    assert!(
        stderr.contains(&closed),
        "the address is not named: {stderr}"
    );
}

/// Every listener is bound before the start-up line: a health-only port in use, or an admin
/// socket path that is not a socket, exits 69 with the reason, and the gate never says it serves.
#[test]
fn a_listener_beside_the_grpc_one_that_cannot_be_bound_exits_69_before_serving() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let not_a_socket = write_file(dir.path(), "not-a-socket", "");
    for (flag, value, reason) in [
        ("--health-listen", taken.as_str(), "health listener"),
        (
            "--admin-socket",
            not_a_socket.to_str().unwrap(),
            "exists and is not a socket",
        ),
    ] {
        let mut command = oncegate_command();
        command
            .args(["serve", "--listen", "127.0.0.1:0", flag, value])
            .args(["--data-dir", data.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null());
        let (code, stderr) = run_to_exit(command);
        assert_eq!(code, Some(69), "{flag}: {stderr}");
        assert!(
            stderr.contains(reason) && stderr.contains(value),
            "{flag}: {stderr}"
        );
        assert!(!stderr.contains("oncegate serving"), "{flag}: {stderr}");
    }
}

/// `oncegate serve` on a fresh embedded store with `worker_threads`, refused every thread (a task
/// limit of one), run to its exit: the exit code and standard error, logged at `info`.
fn serve_embedded_without_threads(worker_threads: &str) -> (Option<i32>, String) {
    let dir = TempDir::new().unwrap();
    let mut command = oncegate_without_threads(&[dir.path()]);
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--worker-threads",
            worker_threads,
        ])
        .args(["--data-dir", dir.path().join("data").to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null());
    run_to_exit(command)
}

/// A runtime of two worker threads that the system refuses: exit 69 with the reason on one line,
/// not Tokio's panic and its backtrace.
#[test]
fn a_runtime_the_system_refuses_threads_exits_69_saying_why() {
    let (code, stderr) = serve_embedded_without_threads("2");
    assert_eq!(code, Some(69), "{stderr}");
    assert!(
        stderr.starts_with("oncegate: cannot start the async runtime: ")
            && stderr.contains("os error 11"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// The embedded store's writer thread refused (one worker thread, so the runtime starts none):
/// exit 69, logged as a store that cannot be opened.
#[test]
fn an_embedded_writer_the_system_refuses_exits_69_saying_why() {
    let (code, stderr) = serve_embedded_without_threads("1");
    assert_eq!(code, Some(69), "{stderr}");
    assert!(
        stderr.contains("cannot open the store") && stderr.contains("starting the writer thread"),
        "{stderr}"
    );
    assert!(!stderr.contains("oncegate serving"), "{stderr}");
}

/// A second serving thread the system refuses (a gate on Redis, unsigned, one worker thread: no
/// other thread comes first): exit 69 with the reason, before the start-up line.
#[test]
fn a_serving_thread_the_system_refuses_exits_69_saying_why() {
    let (code, stderr) =
        serve_on_redis_without_threads(&[], &["--unsigned", "--serving-threads", "2"]);
    assert_eq!(code, Some(69), "{stderr}");
    assert!(
        stderr.contains("cannot start the serving threads: serving thread 1:"),
        "the reason is not logged: {stderr}"
    );
    assert!(!stderr.contains("oncegate serving"), "{stderr}");
}

/// What `make <args>` would run (`make -n`), from the repository root.
fn make_dry_run(args: &[&str]) -> String {
    let out = Command::new("make")
        .args(["-n", "--no-print-directory"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        // Run from `make test`, the outer make's settings would leak in.
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn make_run_passes_flags_and_clean_data_keeps_the_build() {
    let run = make_dry_run(&["run", "ARGS=--config policies.toml --log-format json"]);
    assert!(
        run.contains("cargo build --release --locked --bin oncegate")
            && run
                .contains("target/release/oncegate serve --config policies.toml --log-format json"),
        "{run}"
    );
    // It says what it does: a first build, then where the gate is.
    assert!(
        run.contains("make run: first build") && run.contains("make run: starting the gate"),
        "{run}"
    );
    let clean = make_dry_run(&["clean-data"]);
    assert_eq!(clean.trim(), "rm -rf oncegate-data");
}

#[test]
fn worker_threads_follow_the_flag_the_cpus_and_where_redis_runs() {
    let out = oncegate(&["serve", "--worker-threads", "0"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--worker-threads"),
        "{out:?}"
    );
    // The start-up line of a gate serving with these flags (stopped once it is read).
    let serving = |flags: &[&str]| {
        let dir = TempDir::new().unwrap();
        let args = [&["--listen", "127.0.0.1:0", "--no-admin-socket"], flags].concat();
        let gate = crate::support::LoggedGate::start(&dir, &args);
        gate.wait_for_log("oncegate serving", 1)
    };
    let log = serving(&["--worker-threads", "1"]);
    assert!(
        log.contains("worker_threads=1 runtime=\"current_thread\""),
        "one thread is the current-thread scheduler: {log}"
    );

    // Without the flag, on the embedded store: one worker per CPU, and the line says so.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let scheduler = |threads: usize| match threads {
        1 => "current_thread",
        _ => "multi_thread",
    };
    let log = serving(&[]);
    assert!(
        log.contains(&format!(
            "worker_threads={cpus} runtime=\"{}\" cpus={cpus} worker_threads_rule=\"cpus\"",
            scheduler(cpus)
        )),
        "{log}"
    );

    // Redis on this machine (a loopback address) is left one CPU: one thread on 2 CPUs.
    let redis = crate::support::RedisServer::start();
    let log = serving(&["--redis-url", &format!("redis://127.0.0.1:{}", redis.port)]);
    let (beside, rule) = match cpus {
        1 => (1, "cpus"),
        _ => (cpus - 1, "cpus_but_one_for_local_redis"),
    };
    assert!(
        log.contains(&format!(
            "worker_threads={beside} runtime=\"{}\" cpus={cpus} worker_threads_rule=\"{rule}\"",
            scheduler(beside)
        )),
        "{log}"
    );
}
