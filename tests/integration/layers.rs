//! The layering of `src/` (ARCHITECTURE.md): every `crate::` path in a layer's code names its own
//! layer or one below it, so imports only point down and the layers cannot form a cycle. Read from
//! the sources (comments stripped), so a new upward import fails here, not in review.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

/// The layers, bottom up. Layers of one rank may not use each other.
const LAYERS: [(&str, u8); 8] = [
    ("domain", 0),
    ("pb", 0),
    ("store", 1),
    ("observe", 1),
    ("gate", 2),
    ("grpc", 3),
    ("config", 4),
    ("tools", 5),
];

fn rank(layer: &str) -> Option<u8> {
    LAYERS.iter().find(|(name, _)| *name == layer).map(|l| l.1)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The layer a source file belongs to: its first directory under `src/`, or its stem (`pb.rs`).
/// `None` for the crate root and the binary, which may use every layer.
fn layer_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// The code of `text` without line comments (doc links may point anywhere).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every layer named in `code`: by a `crate::<name>` path, or as a first segment inside a
/// `crate::{ … }` group.
fn layers_named(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            found.extend(group_heads(group));
        } else {
            found.push(
                after
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
        rest = after;
    }
    found.retain(|name| rank(name).is_some());
    found
}

/// The first segment of each item of a `{ a::b, c::{d, e}, f }` group (`group` starts after `{`).
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut at_item_start, mut head) = (0, true, String::new());
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_item_start = true,
            c if at_item_start && (c.is_ascii_alphanumeric() || c == '_') => head.push(c),
            _ if at_item_start && !head.is_empty() => {
                heads.push(std::mem::take(&mut head));
                at_item_start = false;
            }
            _ => {}
        }
    }
    if !head.is_empty() {
        heads.push(head);
    }
    heads
}

#[test]
fn imports_only_point_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut violations = Vec::new();
    let mut uses: BTreeMap<String, usize> = BTreeMap::new();
    for file in &files {
        let Some(layer) = layer_of(&src, file) else {
            continue;
        };
        let Some(own) = rank(&layer) else {
            violations.push(format!(
                "{}: `{layer}` is not a layer of ARCHITECTURE.md",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for target in layers_named(&code(&text)) {
            let Some(theirs) = rank(&target) else {
                continue;
            };
            *uses.entry(format!("{layer} -> {target}")).or_default() += 1;
            if target != layer && theirs >= own {
                violations.push(format!(
                    "{}: `{layer}` (rank {own}) uses `crate::{target}` (rank {theirs})",
                    file.display()
                ));
            }
        }
    }
    violations.sort();
    violations.dedup();
    assert!(
        violations.is_empty(),
        "imports pointing up or sideways:\n{}",
        violations.join("\n")
    );
    // The check saw the layering it guards (not an empty scan).
    for edge in [
        "gate -> domain",
        "grpc -> gate",
        "tools -> config",
        "store -> domain",
    ] {
        assert!(uses.contains_key(edge), "no `{edge}` use found: {uses:?}");
    }
}

#[test]
fn the_check_catches_an_upward_import() {
    let text = "use crate::{\n    domain::ActionKey,\n    gate::{Gate, policy::Policies},\n};\nuse crate::grpc::status; // crate::tools in a comment\nlet x = crate::store::Store::x;\n";
    let mut named = layers_named(&code(text));
    named.sort();
    named.dedup();
    assert_eq!(named, ["domain", "gate", "grpc", "store"]);
}
