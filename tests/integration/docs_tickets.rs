//! Docs and comments speak of the product, not of its tracker: no tracked file names a ticket (the
//! word "issue" or "issues" joined to a number by a space, a hyphen, an underscore or " #", as in a
//! heading, a comment or a test's name; a number after "#" in parentheses; "fixes", "PR" and the
//! like before "#" and a number: the planted lines below show each). A reader meets the feature
//! and the reason; which ticket asked for it is in git's history.
//! What it does not catch: a ticket named any other way (a bare "#21" is also an invoice number,
//! a hex colour's neighbour or a markdown anchor, so only the tracker's own phrasings count).

use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Words that, followed by `#` and a number, name a ticket or a pull request.
const BEFORE_HASH: [&str; 9] = [
    "pr ",
    "pull request ",
    "fixes ",
    "fixed ",
    "closes ",
    "closed ",
    "resolves ",
    "see ",
    "ticket ",
];

/// Whether `line` names a ticket: `issue`/`issues` (not inside a longer word, so "tissue 5" is
/// not one) followed by a space, `-`, `_` or ` #` and a digit; `#` and a number, in parentheses;
/// or `#` and a digit after one of [`BEFORE_HASH`].
fn names_a_ticket(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let digit_at = |i: usize| bytes.get(i).is_some_and(u8::is_ascii_digit);
    for (at, _) in lower.match_indices("issue") {
        if at > 0 && bytes[at - 1].is_ascii_alphabetic() {
            continue;
        }
        let mut i = at + "issue".len();
        if bytes.get(i) == Some(&b's') {
            i += 1;
        }
        match bytes.get(i) {
            Some(b' ') if bytes.get(i + 1) == Some(&b'#') && digit_at(i + 2) => return true,
            Some(b' ' | b'-' | b'_') if digit_at(i + 1) => return true,
            _ => {}
        }
    }
    for (at, _) in lower.match_indices('#') {
        if !digit_at(at + 1) {
            continue;
        }
        let digits = bytes[at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if at > 0 && bytes[at - 1] == b'(' && bytes.get(at + 1 + digits) == Some(&b')') {
            return true;
        }
        if BEFORE_HASH.iter().any(|word| lower[..at].ends_with(word)) {
            return true;
        }
    }
    false
}

/// Every tracked file, as `git ls-files` lists it (the history lives in git, not in the tree).
fn tracked_files() -> Vec<String> {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(ROOT)
        .output()
        .expect("git ls-files runs in the checkout");
    assert!(out.status.success(), "git ls-files: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .split('\0')
        .filter(|path| !path.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn no_tracked_file_names_a_ticket() {
    let mut found = Vec::new();
    let files = tracked_files();
    for path in &files {
        // A file deleted in the worktree but not yet in the index is not there to read.
        let Ok(bytes) = std::fs::read(std::path::Path::new(ROOT).join(path)) else {
            continue;
        };
        for (n, line) in String::from_utf8_lossy(&bytes).lines().enumerate() {
            if names_a_ticket(line) {
                found.push(format!("{path}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(files.len() > 100, "{} tracked files", files.len());
    assert!(
        found.is_empty(),
        "name the feature and the reason, not the ticket:\n{}",
        found.join("\n")
    );
}

/// The check fails on a planted line of each phrasing, and passes text that only looks alike.
/// (The planted lines are put together at run time, so that this file does not name a ticket.)
#[test]
fn the_ticket_check_fails_on_planted_lines_and_passes_lookalikes() {
    let issue = "issue";
    let planted = [
        format!("// fixed in {issue} 18, see CONTRACT.md"),
        format!("### 4.x Signed statements ({issue}s 18, 25)"),
        format!("def test_{issue}_24_guard_is_cheap():"),
        format!("a regression test ({issue}-24)"),
        format!("tracked as {issue} #21"),
        format!("the cold build (#{}) got faster", 21),
        format!("Fixes #{}.", 7),
        format!("# see PR #{} for the numbers", 130),
        format!("const {}_24_CLIENT_US: u64 = 120;", issue.to_uppercase()),
    ];
    for line in &planted {
        assert!(names_a_ticket(line), "not caught: {line}");
    }
    let lookalikes = [
        "#[derive(Debug)]",
        "color: #fff; background: #1e1e2e;",
        "[CONTRACT.md §7](CONTRACT.md#7-events-webhooks)",
        r#"{"memo": "Invoice #42 (corrected)"}"#,
        "Ed25519 private key (PKCS#8 PEM)",
        "the issuer 12 times; an issued 3 tokens",
        "tissue 5, nonissue 3",
        "an issue that the operator sees, a known issue",
        "b\"paid #1\"",
    ];
    for line in lookalikes {
        assert!(!names_a_ticket(line), "caught: {line}");
    }
}
