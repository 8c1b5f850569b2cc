//! The guides' terminal sessions run as written: every `$ ` command of a page's `console` blocks,
//! in order, against a gate this test starts, with `oncegate` on the `PATH` and a temporary
//! directory as the working directory, each output compared with the lines the page shows.
//! `<name>` in an output binds the value printed there (the same name later must print the same
//! value) and in a command stands for it; `...` skips lines; a shown `oncegate call:` (or
//! `admin:`) error line, or a `refused:` line, means the command must fail with exit status 1. So
//! the docs cannot drift from the product: change one, the other must follow. The pages:
//! docs/getting-started.md (the walkthrough), docs/security.md (a grant statement verified
//! offline) and docs/operators-guide.md (the first approval and the first reconciliation, with
//! `oncegate admin` over the admin socket: that page names the gate's address itself, which the
//! test maps to its gate's, and its first `cedar` block is written as `rules.cedar` beside the
//! config). Besides `oncegate`, a session may `sleep`. `docs.rs` checks that no other page has a
//! `console` block.
//!
//! The grpcurl alternative is run by the Python client's tests (`test_docs.py`): grpcurl is not
//! packaged here. What it relies on, reflection describing the error details, is
//! `reflection.rs`'s test.

use std::{collections::HashMap, path::Path, process::Command};

use tempfile::TempDir;

use crate::support::GateProcess;

/// The pages with terminal sessions, and the `oncegate serve` flags of each one's gate beyond
/// `--data-dir` (`{toml}`: the page's first `toml` block, as a file).
pub const SESSIONS: [(&str, &[&str]); 3] = [
    ("docs/getting-started.md", &[]),
    ("docs/security.md", &["--config", "{toml}"]),
    ("docs/operators-guide.md", &["--config", "{toml}"]),
];

/// The address the operator's guide names (the one `make run` listens on), mapped to the test
/// gate's; that page is not given `ONCEGATE_TARGET` nor `ONCEGATE_ADMIN_TARGET`, so `oncegate
/// admin` finds the admin socket.
const MAKE_RUN_ADDRESS: &str = "127.0.0.1:50051";

/// One command of a session and the output the page shows for it.
#[derive(Debug)]
struct Step {
    command: String,
    expected: Vec<String>,
}

/// The `console` blocks of a page, as steps.
fn walkthrough(page: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut in_console = false;
    let mut continued = false;
    for line in page.lines() {
        if line.starts_with("```") {
            in_console = line == "```console";
            continue;
        }
        if !in_console {
            continue;
        }
        if continued {
            let step = steps.last_mut().unwrap();
            step.command.push('\n');
            step.command.push_str(line);
            continued = line.ends_with('\\');
        } else if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                command: command.to_owned(),
                expected: Vec::new(),
            });
            continued = line.ends_with('\\');
        } else {
            steps
                .last_mut()
                .expect("output before any command")
                .expected
                .push(line.to_owned());
        }
    }
    steps
}

/// `text` with each run of spaces as one (column alignment is not the point).
fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Matches one output line against a page's line with `<name>` placeholders; binds new names. A
/// placeholder takes the text up to what follows it in the page's line (or the next space).
fn line_matches(expected: &str, actual: &str, bound: &mut HashMap<String, String>) -> bool {
    let (expected, actual) = (squeeze(expected), squeeze(actual));
    let mut local = bound.clone();
    let (mut e, mut a) = (expected.as_str(), actual.as_str());
    while let Some((open, close)) = e
        .find('<')
        .and_then(|open| e[open..].find('>').map(|c| (open, open + c)))
    {
        let Some(rest) = a.strip_prefix(&e[..open]) else {
            return false;
        };
        let name = &e[open + 1..close];
        let after = &e[close + 1..];
        let next = &after[..after.find('<').unwrap_or(after.len())];
        let len = if next.is_empty() {
            rest.find(' ').unwrap_or(rest.len())
        } else {
            match rest.find(next) {
                Some(at) => at,
                None => return false,
            }
        };
        let value = &rest[..len];
        if value.is_empty() || local.get(name).is_some_and(|v| v != value) {
            return false;
        }
        local.insert(name.to_owned(), value.to_owned());
        e = after;
        a = &rest[len..];
    }
    if e != a {
        return false;
    }
    *bound = local;
    true
}

/// Matches the output lines against the page's, `...` skipping any number of lines.
fn lines_match(
    expected: &[String],
    actual: &[String],
    bound: &mut HashMap<String, String>,
) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "..." => (0..=actual.len()).any(|skip| {
            let mut tried = bound.clone();
            let ok = lines_match(rest, &actual[skip..], &mut tried);
            if ok {
                *bound = tried;
            }
            ok
        }),
        Some((first, rest)) => {
            let Some((line, others)) = actual.split_first() else {
                return false;
            };
            let mut tried = bound.clone();
            let ok = line_matches(first, line, &mut tried) && lines_match(rest, others, &mut tried);
            if ok {
                *bound = tried;
            }
            ok
        }
    }
}

/// The command with each `<name>` replaced by the value printed earlier.
fn substitute(command: &str, bound: &HashMap<String, String>) -> String {
    let mut out = command.to_owned();
    while let Some(open) = out.find('<') {
        let close = open + out[open..].find('>').expect("a closed placeholder");
        let name = &out[open + 1..close];
        let value = bound
            .get(name)
            .unwrap_or_else(|| panic!("the page uses <{name}> before any output shows it"));
        out = format!("{}{value}{}", &out[..open], &out[close + 1..]);
    }
    out
}

/// The page's first block of `lang`, without its fences.
pub fn first_block(page: &str, lang: &str) -> String {
    let start = page
        .find(&format!("```{lang}\n"))
        .unwrap_or_else(|| panic!("no {lang} block"))
        + lang.len()
        + 4;
    page[start..start + page[start..].find("```").unwrap()].to_owned()
}

/// Runs every `console` command of `page` (a path from the repository root) in order, against a
/// gate started with `gate_args`, and compares each output with the page's.
fn run_sessions(page: &str, gate_args: &[&str]) {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(page)).unwrap();
    let steps = walkthrough(&text);
    assert!(steps.len() >= 3, "{page} has its commands: {steps:?}");
    let dir = TempDir::new().unwrap();
    let toml = dir.path().join("oncegate.toml");
    let data = dir.path().join("oncegate-data");
    let mut args = vec!["--data-dir", data.to_str().unwrap()];
    for arg in gate_args {
        if *arg == "{toml}" {
            std::fs::write(&toml, first_block(&text, "toml")).unwrap();
            args.push(toml.to_str().unwrap());
        } else {
            args.push(arg);
        }
    }
    if text.contains("```cedar\n") {
        std::fs::write(dir.path().join("rules.cedar"), first_block(&text, "cedar")).unwrap();
    }
    // Only the operator's guide names the address (the others rely on the environment's).
    let names_address = page == SESSIONS[2].0;
    let gate = GateProcess::spawn(&args);
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_oncegate")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut bound = HashMap::new();
    for step in &steps {
        let command = substitute(&step.command, &bound);
        assert!(
            command.starts_with("oncegate ") || command.starts_with("sleep "),
            "{command}"
        );
        let command = command.replace(MAKE_RUN_ADDRESS, &gate.addr);
        let mut shell = Command::new("sh");
        for name in [
            "ONCEGATE_SERVER",
            "ONCEGATE_TARGET",
            "ONCEGATE_ADMIN_TARGET",
        ] {
            shell.env_remove(name);
        }
        if !names_address {
            shell.env("ONCEGATE_TARGET", &gate.addr);
            shell.env("ONCEGATE_ADMIN_TARGET", &gate.addr);
        }
        let out = shell
            .arg("-c")
            .arg(&command)
            .current_dir(dir.path())
            .env("PATH", &path)
            .env_remove("ONCEGATE_API_KEY")
            .env_remove("ONCEGATE_DATA_DIR")
            .env_remove("ONCEGATE_SIGNING_KEY")
            .output()
            .unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        let actual: Vec<String> = stdout
            .lines()
            .chain(stderr.lines())
            .map(str::to_owned)
            .collect();
        assert!(
            lines_match(&step.expected, &actual, &mut bound),
            "{page}\n$ {command}\nprinted:\n{}\nthe page shows:\n{}",
            actual.join("\n"),
            step.expected.join("\n")
        );
        let fails = step.expected.iter().any(|l| {
            l.starts_with("oncegate call:")
                || l.starts_with("oncegate admin:")
                || l.starts_with("refused:")
        });
        let expected_code = if fails { 1 } else { 0 };
        assert_eq!(
            out.status.code(),
            Some(expected_code),
            "{page}\n$ {command}\n{stderr}"
        );
    }
}

#[test]
fn the_getting_started_walkthrough_runs_as_written() {
    let (page, args) = SESSIONS[0];
    run_sessions(page, args);
}

#[test]
fn the_security_guide_verifies_a_grant_as_written() {
    let (page, args) = SESSIONS[1];
    run_sessions(page, args);
}

#[test]
fn the_operators_guide_approves_and_reconciles_as_written() {
    let (page, args) = SESSIONS[2];
    run_sessions(page, args);
}

#[test]
fn placeholders_bind_and_must_agree() {
    let mut bound = HashMap::new();
    assert!(line_matches(
        "grant.token   <token>",
        "grant.token  abc",
        &mut bound
    ));
    assert_eq!(bound["token"], "abc");
    assert!(line_matches(
        "in <ms> ms, <token>",
        "in 12 ms, abc",
        &mut bound
    ));
    assert!(!line_matches("x <token>", "x abd", &mut bound));
    assert!(!line_matches("decision A", "decision B", &mut bound));
    let lines = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(lines_match(
        &lines(&["a", "...", "d <v>"]),
        &lines(&["a", "b", "c", "d 1"]),
        &mut bound
    ));
    assert!(!lines_match(
        &lines(&["a"]),
        &lines(&["a", "b"]),
        &mut bound
    ));
}
