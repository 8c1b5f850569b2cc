//! The `deploy/` files against the running gate: the alert rules and the dashboard query only
//! series the gate exports or rules.yml records, and the dashboard is JSON. (promtool checks and
//! unit-tests the rules themselves: `make test-deploy`.)

use std::collections::BTreeSet;

use crate::support::{Kind, Scrape, TestGate, token_request};

/// Every `oncegate_*` series the alert rules and the dashboard query is one the gate exports, and
/// every `oncegate:*` series they use is a recording rule defined in rules.yml.
#[tokio::test]
async fn deploy_files_name_only_exported_series() {
    // With a budget, so that the budget series exist too.
    let budget = "[[budgets]]\nname = \"b\"\nwindow_seconds = 60\nlimit = 5\n";
    let (gate, addr) =
        TestGate::start_with_config_and_metrics(Kind::Embedded, crate::support::config(budget))
            .await;
    // One histogram observation of each kind, so their _bucket/_sum/_count series exist.
    gate.client()
        .await
        .request_token(token_request("a", "r", "x", "{}"))
        .await
        .unwrap();
    let scrape = Scrape::fetch(addr).await;
    let exported = scrape.names();
    let root = env!("CARGO_MANIFEST_DIR");
    let rules = std::fs::read_to_string(format!("{root}/deploy/prometheus/rules.yml")).unwrap();
    let dashboard =
        std::fs::read_to_string(format!("{root}/deploy/grafana/oncegate.json")).unwrap();
    serde_json::from_str::<serde_json::Value>(&dashboard).expect("the dashboard is JSON");
    let recorded: BTreeSet<String> = rules
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("- record: ")
                .or(l.trim().strip_prefix("record: "))
        })
        .map(|s| s.trim().to_owned())
        .collect();
    assert!(
        recorded.contains("oncegate:dar:ratio_rate5m"),
        "{recorded:?}"
    );
    for (file, text) in [("rules.yml", &rules), ("oncegate.json", &dashboard)] {
        let names = identifiers(text);
        assert!(!names.is_empty(), "{file} names no series");
        for name in names {
            if name.starts_with("oncegate:") {
                assert!(
                    recorded.contains(&name),
                    "{file}: {name} is not a recording rule"
                );
            } else {
                assert!(
                    exported.contains(name.as_str()),
                    "{file}: {name} is not exported"
                );
            }
        }
    }
}

/// Every metric-name-like identifier: `oncegate_` or `oncegate:` and a lowercase letter.
fn identifiers(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("oncegate") {
        let start = i + at;
        let mut end = start + "oncegate".len();
        let word_start = start == 0 || !is_ident(bytes[start - 1]);
        let separator = matches!(bytes.get(end), Some(b'_' | b':'));
        if word_start && separator && bytes.get(end + 1).is_some_and(u8::is_ascii_lowercase) {
            while end < bytes.len() && (is_ident(bytes[end]) || bytes[end] == b':') {
                end += 1;
            }
            found.insert(text[start..end].to_owned());
        }
        i = end;
    }
    found
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The production overlay ships with principals, an agent and an operator, so that a certificate
/// alone never makes anyone an operator over every agent; its policies file is valid.
#[test]
fn the_prod_overlay_names_its_principals() {
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/deploy/overlays/prod/policies.toml"))
        .expect("the prod overlay has its own policies file");
    let file = oncegate_config::ConfigFile::parse(&text).unwrap();
    assert!(!file.principals.is_empty());
    let kustomization =
        std::fs::read_to_string(format!("{root}/deploy/overlays/prod/kustomization.yaml")).unwrap();
    assert!(kustomization.contains("behavior: replace") && kustomization.contains("policies.toml"));
    for role in ["role = \"agent\"", "role = \"operator\""] {
        assert!(text.contains(role), "{role} missing");
    }
}
