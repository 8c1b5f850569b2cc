//! The layering (ARCHITECTURE.md), held by the compiler and by this file.
//!
//! Between layers: each layer is a crate, so an import that points up is a build error (a cycle
//! between crates cannot even be written). What the compiler cannot see is a dependency between
//! crates of one rank or one that skips the intended order (the store using observe, the client
//! using the gate): [`crates_depend_only_downwards`] checks every crate's dependencies against
//! the ranks below, and [`the_client_crate_is_light`] what a user of the client compiles.
//!
//! Inside a crate (every workspace member's, the Python client's native core among them): no two
//! modules may depend on each other, however indirectly. Every `crate::`, `super::` and `self::`
//! path of a file (comments and strings stripped) is an edge between the two sibling modules it
//! crosses; [`no_module_depends_on_itself`] fails on any cycle among siblings. A child using its
//! parent's items (or the parent declaring its children) is not an edge: that is what a module is.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

/// The crates, bottom up. A crate may depend only on crates of a lower rank.
const RANKS: [(&str, u8); 15] = [
    ("oncegate-proto", 0),
    ("oncegate-domain", 0),
    ("oncegate-store", 1),
    ("oncegate-observe", 1),
    ("oncegate-gate", 2),
    ("oncegate-client", 2),
    ("oncegate-grpc", 3),
    ("oncegate-notify", 3),
    ("oncegate-rules", 3),
    ("oncegate-config", 4),
    ("oncegate-console", 4),
    // The server as `oncegate serve` assembles it, for the binary and for `oncegate.local`.
    ("oncegate-server", 5),
    ("oncegate-mcp", 5),
    ("oncegate", 6),
    // The Python client's native core (clients/python/native): its calls, and the server in
    // process for `oncegate.local`, beside the binary.
    ("oncegate-native", 6),
];

fn rank(name: &str) -> Option<u8> {
    RANKS.iter().find(|(n, _)| *n == name).map(|r| r.1)
}

/// `cargo metadata` of the workspace (its own packages only).
fn metadata() -> serde_json::Value {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn crates_depend_only_downwards() {
    let meta = metadata();
    let packages = meta["packages"].as_array().unwrap();
    let mut violations = Vec::new();
    let mut edges = 0;
    for package in packages {
        let name = package["name"].as_str().unwrap();
        let Some(own) = rank(name) else {
            violations.push(format!("{name} is not a crate of ARCHITECTURE.md's layers"));
            continue;
        };
        for dep in package["dependencies"].as_array().unwrap() {
            let theirs = dep["name"].as_str().unwrap();
            let normal = dep["kind"].is_null();
            let Some(their_rank) = rank(theirs) else {
                continue;
            };
            edges += 1;
            if normal && their_rank >= own {
                violations.push(format!(
                    "{name} (rank {own}) depends on {theirs} (rank {their_rank})"
                ));
            }
        }
    }
    assert_eq!(packages.len(), RANKS.len(), "every crate has a rank");
    assert!(
        edges >= 20,
        "the check saw the workspace's dependencies ({edges})"
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_client_crate_is_light() {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-p",
            "oncegate-client",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8(out.stdout).unwrap();
    let names: BTreeSet<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(names.contains("tonic"), "the tree was read: {tree}");
    for heavy in [
        "redb",
        "redis",
        "cedar-policy",
        "rmcp",
        "axum",
        "oncegate-store",
        "oncegate-gate",
    ] {
        assert!(
            !names.contains(heavy),
            "the client pulls in {heavy}:\n{tree}"
        );
    }
}

/// A module of one crate, as a path from the crate root (`[]` is the root).
type ModPath = Vec<String>;

/// Every source file of the crate rooted at `src`, with its module path.
fn modules(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    fn walk(dir: &Path, at: &ModPath, out: &mut BTreeMap<ModPath, PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
            if path.is_dir() {
                let mut inner = at.clone();
                inner.push(name);
                walk(&path, &inner, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let mut module = at.clone();
                if !matches!(name.as_str(), "lib" | "main" | "mod") {
                    module.push(name);
                }
                out.insert(module, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, &Vec::new(), &mut out);
    out
}

/// `text` without comments and string literals (a doc link or a message may name anything).
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    match c {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => break,
                        _ => escaped = false,
                    }
                }
                out.push_str("\"\"");
            }
            // A char literal holding a quote ('"') must not open a string.
            '\'' => {
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with("\"'") {
                    chars.nth(1);
                }
                out.push('\'');
            }
            c => out.push(c),
        }
    }
    out
}

/// Every path starting at `crate`, `super` or `self` in `code`, with `{…}` groups expanded, as
/// its segments (the leading keyword included).
fn paths(code: &str) -> Vec<Vec<String>> {
    let bytes: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_');
        let rest: String = bytes[i..bytes.len().min(i + 8)].iter().collect();
        let keyword = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|k| rest.starts_with(k));
        match keyword {
            Some(k) if starts_word && (i == 0 || bytes[i - 1] != '$') => {
                let (mut tails, end) = path_at(&bytes, i + k.len() - 2);
                for tail in &mut tails {
                    tail.insert(0, k.trim_end_matches("::").to_owned());
                }
                found.extend(tails);
                i = end;
            }
            _ => i += 1,
        }
    }
    found
}

/// The paths continuing at `at` (which points at `::` or at the first segment), and where they
/// end.
fn path_at(code: &[char], mut at: usize) -> (Vec<Vec<String>>, usize) {
    let mut segments = Vec::new();
    loop {
        while code.get(at).is_some_and(|c| c.is_whitespace()) {
            at += 1;
        }
        if code.get(at) == Some(&':') && code.get(at + 1) == Some(&':') {
            at += 2;
            continue;
        }
        if code.get(at) == Some(&'{') {
            let mut all = Vec::new();
            at += 1;
            loop {
                while code.get(at).is_some_and(|c| c.is_whitespace() || *c == ',') {
                    at += 1;
                }
                match code.get(at) {
                    None => return (all, at),
                    Some('}') => return (prefixed(&segments, all), at + 1),
                    _ => {
                        let (inner, end) = path_at(code, at);
                        all.extend(inner);
                        // Skip `as name` and anything up to the next item.
                        at = end;
                        while code.get(at).is_some_and(|c| *c != ',' && *c != '}') {
                            at += 1;
                        }
                    }
                }
            }
        }
        let start = at;
        while code
            .get(at)
            .is_some_and(|c| c.is_alphanumeric() || *c == '_')
        {
            at += 1;
        }
        if at == start {
            return (vec![segments], at);
        }
        segments.push(code[start..at].iter().collect());
        if !(code.get(at) == Some(&':') && code.get(at + 1) == Some(&':')) {
            return (vec![segments], at);
        }
    }
}

fn prefixed(prefix: &[String], tails: Vec<Vec<String>>) -> Vec<Vec<String>> {
    tails
        .into_iter()
        .map(|tail| prefix.iter().cloned().chain(tail).collect())
        .collect()
}

/// The module a path from module `from` names (its longest prefix that is a module), or `None`
/// when it leaves the crate or names nothing known.
fn target(from: &ModPath, path: &[String], known: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut base: ModPath = match path.first()?.as_str() {
        "crate" => Vec::new(),
        _ => from.clone(),
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        base.pop();
        while rest.first().is_some_and(|s| s == "super") {
            base.pop();
            rest = &rest[1..];
        }
    }
    let mut module = base;
    for segment in rest {
        let mut next = module.clone();
        next.push(segment.clone());
        if known.contains(&next) {
            module = next;
        } else {
            break;
        }
    }
    Some(module)
}

/// The sibling edges of one crate: `(parent, from child, to child) → the files that make it`.
type Edges = BTreeMap<(ModPath, String, String), BTreeSet<String>>;

fn sibling_edges(src: &Path) -> Edges {
    let files = modules(src);
    let known: BTreeSet<ModPath> = files.keys().cloned().collect();
    let mut edges = Edges::new();
    for (module, file) in &files {
        let text = code(&std::fs::read_to_string(file).unwrap());
        for path in paths(&text) {
            let Some(to) = target(module, &path, &known) else {
                continue;
            };
            add_edge(&mut edges, module, &to, &file.display().to_string());
        }
    }
    edges
}

fn add_edge(edges: &mut Edges, from: &ModPath, to: &ModPath, file: &str) {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if common == from.len() || common == to.len() {
        return; // the same module, or a parent and its child
    }
    let parent = from[..common].to_vec();
    edges
        .entry((parent, from[common].clone(), to[common].clone()))
        .or_default()
        .insert(file.to_owned());
}

/// The cycles among siblings, each as `parent: a → b → … → a` with the files behind each edge.
fn cycles(edges: &Edges) -> Vec<String> {
    let mut by_parent: BTreeMap<&ModPath, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for (parent, from, to) in edges.keys() {
        by_parent
            .entry(parent)
            .or_default()
            .entry(from)
            .or_default()
            .insert(to);
    }
    let mut found = Vec::new();
    for (parent, graph) in by_parent {
        for start in graph.keys() {
            // The shortest way back to `start`, if any (breadth first).
            let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([*start]);
            let mut back = None;
            while let Some(at) = queue.pop_front() {
                for next in graph.get(at).into_iter().flatten() {
                    if next == start {
                        back = Some(at);
                        break;
                    }
                    if !seen.contains_key(next) {
                        seen.insert(next, at);
                        queue.push_back(next);
                    }
                }
                if back.is_some() {
                    break;
                }
            }
            let Some(mut at) = back else { continue };
            let mut cycle = vec![*start, at];
            while at != *start {
                at = seen[at];
                cycle.push(at);
            }
            cycle.reverse();
            let why: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let files = &edges[&(parent.clone(), w[0].to_owned(), w[1].to_owned())];
                    format!(
                        "{} → {} ({})",
                        w[0],
                        w[1],
                        files.iter().cloned().collect::<Vec<_>>().join(", ")
                    )
                })
                .collect();
            found.push(format!(
                "in `{}`: {}",
                if parent.is_empty() {
                    "crate".into()
                } else {
                    parent.join("::")
                },
                why.join("; ")
            ));
        }
    }
    found.sort();
    found.dedup();
    found
}

/// Every workspace member's `src/` (the root package's, the crates under `crates/` and the Python
/// client's native core): read from `cargo metadata`, so that a member added anywhere is checked.
fn crate_sources() -> Vec<PathBuf> {
    let meta = metadata();
    let mut dirs: Vec<PathBuf> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| {
            let manifest = Path::new(package["manifest_path"].as_str().unwrap());
            manifest.parent().unwrap().join("src")
        })
        .filter(|src| src.is_dir())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn no_module_depends_on_itself() {
    let mut problems = Vec::new();
    let mut total = 0;
    for src in crate_sources() {
        let edges = sibling_edges(&src);
        total += edges.len();
        let krate = src.parent().unwrap().file_name().unwrap().to_string_lossy();
        problems.extend(cycles(&edges).into_iter().map(|c| format!("{krate}: {c}")));
    }
    assert!(
        total > 50,
        "the check saw the modules' imports ({total} edges)"
    );
    let native = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python/native/src");
    assert!(
        crate_sources().contains(&native),
        "the check reads the Python client's native core"
    );
    assert!(
        problems.is_empty(),
        "modules that depend on each other:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_check_sees_groups_supers_and_cycles() {
    let text = "use super::{a::X, b::{c::Y, d}};\n// crate::z in a comment\nlet s = \"crate::w\";\nlet v = crate::e::f::g();\nuse super::super::h as k;\n";
    let found = paths(&code(text));
    let shown: Vec<String> = found.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        shown,
        [
            "super::a::X",
            "super::b::c::Y",
            "super::b::d",
            "crate::e::f::g",
            "super::super::h"
        ]
    );
    let known: BTreeSet<ModPath> = [vec![], vec!["a"], vec!["b"], vec!["b", "c"]]
        .into_iter()
        .map(|m| m.into_iter().map(String::from).collect())
        .collect();
    let module = |m: &[&str]| -> ModPath { m.iter().map(|s| s.to_string()).collect() };
    let mut edges = Edges::new();
    // b::c uses a, and a uses b: a cycle between the siblings a and b of the root.
    for (from, path) in [
        (module(&["b", "c"]), "crate::a::X"),
        (module(&["a"]), "super::b::c::Y"),
    ] {
        let path: Vec<String> = path.split("::").map(String::from).collect();
        let to = target(&from, &path, &known).unwrap();
        add_edge(&mut edges, &from, &to, "test.rs");
    }
    let found = cycles(&edges);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains("a → b") && found[0].contains("b → a"),
        "{found:?}"
    );
    // A child using its parent is no edge.
    let mut edges = Edges::new();
    add_edge(&mut edges, &module(&["b", "c"]), &module(&["b"]), "test.rs");
    assert!(edges.is_empty());
}
