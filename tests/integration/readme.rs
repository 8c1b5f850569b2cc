//! The README's walkthrough ("One action, end to end") runs as written: every `$ ` command of its
//! `console` blocks, in order, against a gate this test starts, with `oncegate` on the `PATH`, and
//! each output compared with the lines the README shows. `<name>` in an output binds the value
//! printed there (the same name later must print the same value) and in a command stands for it;
//! `...` skips lines; a shown `oncegate call:` (or `admin:`) error line means the command must
//! fail with exit status 1. So the README cannot drift from the product: change one, the other
//! must follow.
//!
//! The grpcurl alternative after it is not run: grpcurl is not packaged here. What it relies on,
//! reflection describing the error details, is `reflection.rs`'s test.

use std::{collections::HashMap, path::Path, process::Command};

use tempfile::TempDir;

use crate::support::GateProcess;

const SECTION: &str = "## One action, end to end";

/// One command of the walkthrough and the output the README shows for it.
#[derive(Debug)]
struct Step {
    command: String,
    expected: Vec<String>,
}

/// The `console` blocks of the walkthrough section, as steps.
fn walkthrough(readme: &str) -> Vec<Step> {
    let start = readme.find(SECTION).expect("the walkthrough section");
    let body = &readme[start + SECTION.len()..];
    let end = body
        .find("\n## ")
        .into_iter()
        .chain(body.find("\n### "))
        .min()
        .unwrap_or(body.len());
    let mut steps: Vec<Step> = Vec::new();
    let mut in_console = false;
    let mut continued = false;
    for line in body[..end].lines() {
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

/// Matches one output line against a README line with `<name>` placeholders; binds new names. A
/// placeholder takes the text up to what follows it in the README line (or the next space).
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

/// Matches the output lines against the README's, `...` skipping any number of lines.
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
            .unwrap_or_else(|| panic!("the README uses <{name}> before any output shows it"));
        out = format!("{}{value}{}", &out[..open], &out[close + 1..]);
    }
    out
}

#[test]
fn the_readme_walkthrough_runs_as_written() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let steps = walkthrough(&readme);
    assert!(
        steps.len() >= 8,
        "the walkthrough has its commands: {steps:?}"
    );
    let dir = TempDir::new().unwrap();
    let gate = GateProcess::spawn(&["--data-dir", dir.path().to_str().unwrap()]);
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_oncegate")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut bound = HashMap::new();
    for step in &steps {
        let command = substitute(&step.command, &bound);
        assert!(command.starts_with("oncegate "), "{command}");
        let out = Command::new("sh")
            .arg("-c")
            .arg(&command)
            .env("PATH", &path)
            .env("ONCEGATE_SERVER", format!("http://{}", gate.addr))
            .env_remove("ONCEGATE_API_KEY")
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
            "$ {command}\nprinted:\n{}\nthe README shows:\n{}",
            actual.join("\n"),
            step.expected.join("\n")
        );
        let fails = step
            .expected
            .iter()
            .any(|l| l.starts_with("oncegate call:") || l.starts_with("oncegate admin:"));
        let expected_code = if fails { 1 } else { 0 };
        assert_eq!(
            out.status.code(),
            Some(expected_code),
            "$ {command}\n{stderr}"
        );
    }
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
