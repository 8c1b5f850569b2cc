//! Every code block of the README and of docs/ is run by a test, or is output: a terminal session
//! (`console`) is `readme.rs`'s, Python and TypeScript snippets are the clients' suites'
//! (`test_readme.py`, `docs.test.ts`; they must read `ONCEGATE_TARGET`), the Rust snippets are this
//! file's (verbatim in `pay_invoice_1001` and `resolve_from_the_bank`, called against a real gate), a TOML file loads with the
//! real parser (with the page's Cedar file beside it), `make` commands name real targets, the
//! grpcurl and MCP commands and the MCP client's JSON are run by `test_docs.py` of the Python
//! client and of `tests/mcp`; `text` and bare blocks are output and hold no `$ ` command. And the
//! configuration reference names every flag of `oncegate serve --help` and every key the file's
//! parser accepts.

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
};

use oncegate_client::Outcome;
use oncegate_config::ConfigFile;
use tempfile::TempDir;

use crate::{
    readme::SESSIONS,
    support::{Kind, TestGate, oncegate_command},
};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// One fenced block: the page (from the repository root), its language tag, its text.
#[derive(Debug)]
struct Block {
    page: String,
    lang: String,
    text: String,
}

/// README.md and every Markdown file under docs/.
fn pages() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut found = vec![Path::new(ROOT).join("README.md")];
    walk(&Path::new(ROOT).join("docs"), &mut found);
    let mut pages: Vec<String> = found
        .iter()
        .map(|p| p.strip_prefix(ROOT).unwrap().to_str().unwrap().to_owned())
        .collect();
    pages.sort();
    pages
}

fn read(page: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(page)).unwrap()
}

/// The fenced blocks of `page`.
fn blocks(page: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for line in read(page).lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(lang)) => {
                open = Some(Block {
                    page: page.to_owned(),
                    lang: lang.trim().to_owned(),
                    text: String::new(),
                })
            }
            (Some(_), Some(_)) => out.push(open.take().unwrap()),
            (Some(block), None) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{page}: a block is not closed");
    out
}

fn every_block() -> Vec<Block> {
    pages().iter().flat_map(|p| blocks(p)).collect()
}

/// The snippet `name` as this file holds it between its markers (`pay_invoice_1001`'s, "the Rust
/// snippet"; `resolve_from_the_bank`'s, "the Rust resolver snippet"), without its indentation.
fn rust_snippet(name: &str) -> String {
    let source = include_str!("docs.rs");
    let begin = format!("    // docs: {name}, begin\n");
    let start = source.find(&begin).unwrap() + begin.len();
    let end = start
        + source[start..]
            .find(&format!("    // docs: {name}, end"))
            .unwrap();
    source[start..end]
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Whether `command` (a line of an `sh` block) is run by a test, and by which.
fn sh_is_run(page: &str, first: &str) -> Result<(), String> {
    if let Some(target) = first.strip_prefix("make ") {
        let target = target.split_whitespace().next().unwrap_or_default();
        let makefile = read("Makefile");
        return if makefile
            .lines()
            .any(|l| l.starts_with(&format!("{target}:")))
        {
            Ok(())
        } else {
            Err(format!("no make target {target:?}"))
        };
    }
    if page == "docs/agents/typescript.md"
        && first.starts_with("cd clients/typescript && npm ci && npm pack")
    {
        return Ok(()); // tests/artifacts/test_routes.py takes this route as written
    }
    match (page, first.split_whitespace().next()) {
        ("docs/getting-started.md", Some("grpcurl")) => Ok(()), // clients/python/tests/test_docs.py
        ("docs/agents/mcp.md", Some("ONCEGATE_API_KEY=$AGENT_KEY")) => Ok(()), // tests/mcp/test_docs.py
        _ => Err("no test runs this command".into()),
    }
}

#[test]
fn every_block_of_the_docs_is_run_by_a_test_or_is_output() {
    let rust = [
        rust_snippet("the Rust snippet"),
        rust_snippet("the Rust resolver snippet"),
    ];
    let sessions: Vec<&str> = SESSIONS.iter().map(|(page, _)| *page).collect();
    let mut kinds = std::collections::BTreeSet::new();
    for block in every_block() {
        let Block { page, lang, text } = &block;
        let verdict: Result<(), String> = match lang.as_str() {
            "console" if sessions.contains(&page.as_str()) => Ok(()),
            "python" | "ts" if text.contains("ONCEGATE_TARGET") => Ok(()),
            "rust" if rust.contains(text) => Ok(()),
            "rust" => Err(format!(
                "not a snippet pay_invoice_1001 or resolve_from_the_bank runs:\n{}",
                rust.join("\n")
            )),
            // Loaded below.
            "toml" | "cedar" => Ok(()),
            "json" if page == "docs/agents/mcp.md" => Ok(()), // tests/mcp/test_docs.py
            "sh" => {
                let mut lines = text.lines().filter(|l| !l.trim_start().starts_with('#'));
                let first = lines.next().unwrap_or_default();
                sh_is_run(page, first).and_then(|()| {
                    if first.starts_with("make ") && !lines.all(|l| l.starts_with("make ")) {
                        Err("a make block holds make commands only".into())
                    } else {
                        Ok(())
                    }
                })
            }
            "text" | "" if !text.lines().any(|l| l.starts_with("$ ")) => Ok(()),
            _ => Err("no test runs this block".into()),
        };
        if let Err(why) = verdict {
            panic!("{page}: a {lang:?} block: {why}\n{text}");
        }
        kinds.insert(lang.clone());
    }
    for lang in [
        "console", "python", "ts", "rust", "toml", "cedar", "json", "sh",
    ] {
        assert!(
            kinds.contains(lang),
            "no {lang} block found: the scan is broken"
        );
    }
}

/// Every TOML block loads with the real parser, in a folder holding the page's Cedar block (an
/// empty policy file when the page has none) as `rules.cedar`.
#[test]
fn every_toml_block_of_the_docs_loads() {
    let mut loaded = 0;
    for page in pages() {
        let page_blocks = blocks(&page);
        let cedar = page_blocks
            .iter()
            .find(|b| b.lang == "cedar")
            .map_or("", |b| b.text.as_str());
        for block in page_blocks.iter().filter(|b| b.lang == "toml") {
            let dir = TempDir::new().unwrap();
            std::fs::write(dir.path().join("rules.cedar"), cedar).unwrap();
            let path = dir.path().join("oncegate.toml");
            std::fs::write(&path, &block.text).unwrap();
            if let Err(e) = ConfigFile::load_with_mcp(&path) {
                panic!("{page}: a toml block does not load: {e}\n{}", block.text);
            }
            loaded += 1;
        }
    }
    assert!(loaded >= 8, "{loaded} toml blocks");
}

/// The keys the file's parser accepts in `table` (`""`: the top level): an unknown key's error
/// lists them.
fn accepted_keys(table: &str) -> Vec<String> {
    let err = ConfigFile::parse(&format!("{table}\nzz_not_a_key = 1\n"))
        .err()
        .unwrap_or_else(|| panic!("{table}: an unknown key is accepted"))
        .to_string();
    let listed = &err[err
        .find("expected")
        .unwrap_or_else(|| panic!("{table}: {err}"))..];
    let listed = &listed[..listed.find('\n').unwrap_or(listed.len())];
    let keys: Vec<String> = listed
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(!keys.is_empty(), "{table}: {err}");
    keys
}

#[test]
fn the_config_reference_names_every_key_and_flag() {
    let reference = read("docs/reference/config.md");
    let toml: String = blocks("docs/reference/config.md")
        .into_iter()
        .filter(|b| b.lang == "toml")
        .map(|b| b.text)
        .collect();
    let mut checked = 0;
    for table in [
        "",
        "[defaults]",
        "[limits]",
        r#"[actions."x"]"#,
        "[[principals]]",
        "[authorization]",
        "[[budgets]]",
        "[notifications]",
        "[[webhooks]]",
        "[mcp]",
        r#"[mcp.tools."x"]"#,
    ] {
        for key in accepted_keys(table) {
            let shown = toml.lines().any(|l| {
                l.starts_with(&format!("{key} ="))
                    || l.starts_with(&format!("[{key}"))
                    || l.starts_with(&format!("[[{key}]]"))
                    || l.starts_with(&format!("[mcp.{key}."))
            });
            assert!(
                shown,
                "docs/reference/config.md shows no `{key}` of {table:?}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 40, "{checked} keys");

    let help = oncegate_command()
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let flags: Vec<&str> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .map(|l| l.split([' ', ',', '<']).next().unwrap())
        .collect();
    assert!(flags.len() >= 30, "{flags:?}");
    for flag in flags.iter().filter(|f| !["help", "version"].contains(f)) {
        assert!(
            reference.contains(&format!("`--{flag}`")),
            "docs/reference/config.md does not name --{flag}"
        );
    }
}

/// A stand-in for a payment provider: it records each payment.
#[derive(Default)]
struct Bank {
    paid: Mutex<Vec<String>>,
}

#[derive(Debug)]
struct BankError;

impl std::fmt::Display for BankError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the bank failed")
    }
}

impl std::error::Error for BankError {}

impl Bank {
    async fn pay(&self, amount: u64, provider_key: &str) -> Result<String, BankError> {
        let mut paid = self.paid.lock().unwrap();
        paid.push(format!("{amount} with key {provider_key}"));
        Ok(format!("tx-{}", paid.len()))
    }

    /// The transfer paid with `provider_key` as its idempotency key, if any.
    async fn find(&self, provider_key: &str) -> Result<Option<String>, BankError> {
        let paid = self.paid.lock().unwrap();
        let at = paid
            .iter()
            .position(|p| p.ends_with(&format!(" with key {provider_key}")));
        Ok(at.map(|i| format!("tx-{}", i + 1)))
    }
}

/// The Rust snippet of the README and docs/agents/rust.md, verbatim between the markers.
async fn pay_invoice_1001(
    gate_url: String,
    bank: &Bank,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    // docs: the Rust snippet, begin
    use oncegate_client::{ActionSpec, Failure, GateClient, GuardOptions};

    // `bank` is your provider's client; the test that runs this snippet passes a fake one.
    let gate = GateClient::connect(gate_url).await?; // e.g. "http://127.0.0.1:50051"
    let spec = ActionSpec::new(
        "billing-agent",
        "run-42",
        "payments.transfer",
        r#"{"amount":100,"to":"DE89"}"#,
    )
    .idempotency_key("invoice-1001");
    let outcome = gate
        .run_once(&spec, &GuardOptions::default(), |grant| async move {
            let tx = bank
                .pay(100, &grant.provider_key)
                .await
                .map_err(Failure::Ambiguous)?;
            Ok::<_, Failure<BankError>>(tx.into_bytes())
        })
        .await?; // Outcome::Executed { receipt, grant } or Outcome::Replayed(replay)
    // docs: the Rust snippet, end
    Ok(outcome)
}

#[tokio::test]
async fn the_rust_snippet_pays_once_and_then_replays() {
    let gate = TestGate::start(Kind::Embedded).await;
    let bank = Bank::default();
    let url = format!("http://{}", gate.addr);
    let first = pay_invoice_1001(url.clone(), &bank).await.unwrap();
    let again = pay_invoice_1001(url, &bank).await.unwrap();
    match (first, again) {
        (Outcome::Executed { receipt, .. }, Outcome::Replayed(done)) => {
            assert_eq!(receipt, b"tx-1");
            assert_eq!(done.receipt, receipt, "the retry gets the original receipt");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(bank.paid.lock().unwrap().len(), 1, "paid once");
}

/// The Rust snippet of docs/resolvers.md, verbatim between the markers: a resolver that asks the
/// bank about each unresolved payment, until `stop` resolves.
async fn resolve_from_the_bank(
    gate_url: String,
    resolver_key: &str,
    bank: std::sync::Arc<Bank>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), Box<dyn std::error::Error>> {
    // docs: the Rust resolver snippet, begin
    use std::time::Duration;

    use oncegate_client::{Lookup, Resolver};

    // `bank` is your provider's client, shared (an Arc); it can find a transfer by idempotency key.
    let channel = tonic::transport::Endpoint::from_shared(gate_url)?.connect_lazy();
    let resolver = Resolver::new(channel)
        .with_api_key(resolver_key)? // a principal with role = "resolver"
        .timeout(Duration::from_secs(10)) // a slower lookup leaves the action for a person
        .lookup("payments.transfer", move |u| {
            let bank = bank.clone();
            async move {
                Ok(match bank.find(&u.provider_key).await? {
                    Some(tx) => Lookup::json(&serde_json::json!({ "tx": tx })), // it happened
                    None => Lookup::Unknown, // left for a person (listed, notified)
                })
            }
        });
    resolver.run(stop).await; // settles what the bank knows, until `stop` resolves
    // docs: the Rust resolver snippet, end
    Ok(())
}

#[tokio::test]
async fn the_rust_resolver_snippet_settles_a_payment_whose_worker_died() {
    use crate::support::{
        OPS_KEY, WORKER_KEY, authed, config, principals_toml, token_request, ttl_ms, unresolved_of,
        wait_until_completed,
    };
    use oncegate_proto as pb;

    const RESOLVER_KEY: &str = "docs-resolver-key";
    let gate = TestGate::start_with(
        Kind::Embedded,
        config(&format!(
            "[limits]\nmin_lease_ttl_seconds = 0.05\n{}\n[[principals]]\nname = \"bank-resolver\"\n\
             role = \"resolver\"\nactions = [\"payments.*\"]\napi_key_sha256 = \"{}\"\n",
            principals_toml(""),
            oncegate_grpc::auth::hash_key(RESOLVER_KEY)
        )),
    )
    .await;
    let mut client = gate.client().await;
    // The worker: granted, pays the bank with the provider key, and dies before Complete.
    let mut req = token_request(
        "billing-docs",
        "run-1",
        "payments.transfer",
        r#"{"amount":100}"#,
    );
    req.lease_ttl = ttl_ms(100);
    let granted = client
        .request_token(authed(req.clone(), Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    let grant = granted.grant.unwrap();
    let bank = std::sync::Arc::new(Bank::default());
    bank.pay(100, &grant.provider_key).await.unwrap();
    gate.time.pass_beyond(grant.lease_expires_at.unwrap()).await;

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let url = format!("http://{}", gate.addr);
    let resolving = tokio::spawn({
        let bank = bank.clone();
        async move {
            resolve_from_the_bank(url, RESOLVER_KEY, bank, async {
                let _ = stopped.await;
            })
            .await
            .map_err(|e| e.to_string())
        }
    });
    let action = granted.action.clone().unwrap();
    let patience = std::time::Duration::from_secs(30);
    wait_until_completed(&mut client, &action, Some(WORKER_KEY), patience).await;
    let _ = stop.send(());
    resolving.await.unwrap().unwrap();

    // The agent's retry replays the bank's answer; nothing was paid twice; nothing is left.
    req.lease_ttl = None;
    let retry = client
        .request_token(authed(req, Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retry.decision(), pb::Decision::AlreadyCompleted);
    let completion = retry.completion.unwrap();
    assert_eq!(completion.receipt, br#"{"tx":"tx-1"}"#);
    assert_eq!(completion.operator, "bank-resolver");
    assert_eq!(bank.paid.lock().unwrap().len(), 1);
    let left = unresolved_of(&mut gate.admin().await, "billing-docs", OPS_KEY).await;
    assert!(left.is_empty(), "{left:?}");
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The text of `page` outside its fenced blocks.
fn prose(page: &str) -> String {
    let mut fenced = false;
    read(page)
        .lines()
        .filter(|line| {
            if line.starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every relative link of the README and docs/ names a file that exists and, with `#…`, a heading
/// of it: a page moved or a section renamed breaks a test, not a reader.
#[test]
fn every_link_of_the_docs_resolves() {
    let mut checked = 0;
    for page in pages() {
        let text = prose(&page);
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            let link = &rest[..rest.find(')').unwrap()];
            if link.starts_with("http") {
                continue;
            }
            let (path, fragment) = link.split_once('#').unwrap_or((link, ""));
            let target = if path.is_empty() {
                page.clone()
            } else {
                let joined = Path::new(&page).parent().unwrap().join(path);
                let mut parts: Vec<&str> = Vec::new();
                for part in joined.to_str().unwrap().split('/') {
                    match part {
                        "." | "" => {}
                        ".." => {
                            parts.pop();
                        }
                        part => parts.push(part),
                    }
                }
                parts.join("/")
            };
            assert!(
                Path::new(ROOT).join(&target).exists(),
                "{page}: {link}: no {target}"
            );
            if !fragment.is_empty() {
                let headings: Vec<String> = prose(&target)
                    .lines()
                    .filter_map(|l| {
                        l.trim_start_matches('#')
                            .strip_prefix(' ')
                            .filter(|_| l.starts_with('#'))
                    })
                    .map(anchor)
                    .collect();
                assert!(
                    headings.iter().any(|h| h == fragment),
                    "{page}: {link}: no heading #{fragment} in {target}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 50, "{checked} links");
}
