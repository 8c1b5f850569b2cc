//! The gate's authorization rules as Cedar policies: [`CedarRules`] loads and validates the policy
//! files and evaluates each RequestToken's facts (the semantics are documented at
//! [`oncegate_gate::rules`], where the gate asks through [`RuleSet`]). A crate of its own so that
//! Cedar, the largest dependency of the build, compiles beside the gate instead of before it.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    str::FromStr,
    sync::{Arc, RwLock},
};

use cedar_policy::{
    Authorizer, Context, Decision, Entities, Entity, EntityId, EntityTypeName, EntityUid, PolicyId,
    PolicySet, Request, RestrictedExpression,
};
use oncegate_gate::rules::{Facts, RuleSet, Rules, Verdict};

/// A validated set of Cedar policies, from the files that hold them.
#[derive(Debug, Clone)]
pub struct CedarRules {
    set: PolicySet,
    files: Vec<PathBuf>,
    count: usize,
    authorizer: Arc<Authorizer>,
    /// The action hierarchy of each action seen, built once (bounded: action names come from
    /// clients; past the bound, each request builds its own).
    hierarchies: Arc<RwLock<HashMap<String, Arc<Entities>>>>,
}

/// How many actions' hierarchies are kept.
const HIERARCHIES: usize = 1024;

impl CedarRules {
    /// Reads and parses every file; the error is Cedar's own, prefixed with the file.
    pub fn load(files: &[PathBuf]) -> Result<Self, String> {
        let mut set = PolicySet::new();
        let mut ids = HashSet::new();
        for file in files {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let parsed = PolicySet::from_str(&text).map_err(|e| {
                let all: Vec<String> = e.iter().map(|e| e.to_string()).collect();
                format!("{}: {}", file.display(), all.join("; "))
            })?;
            let name = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            for (n, policy) in parsed.policies().enumerate() {
                let id = match policy.annotation("id") {
                    Some(id) if !id.is_empty() => id.to_owned(),
                    _ => format!("{name}#{n}"),
                };
                if !ids.insert(id.clone()) {
                    return Err(format!(
                        "{}: policy id {id:?} is used twice",
                        file.display()
                    ));
                }
                set.add(policy.new_id(PolicyId::new(&id)))
                    .map_err(|e| format!("{}: {e}", file.display()))?;
            }
            if parsed.templates().next().is_some() {
                return Err(format!(
                    "{}: policy templates are not supported",
                    file.display()
                ));
            }
        }
        Ok(Self {
            count: ids.len(),
            set,
            files: files.to_vec(),
            authorizer: Arc::new(Authorizer::new()),
            hierarchies: Arc::default(),
        })
    }

    /// Reads and parses every file, as a shared [`Rules`] for the gate.
    pub fn shared(files: &[PathBuf]) -> Result<Rules, String> {
        Ok(Arc::new(Self::load(files)?))
    }
}

impl RuleSet for CedarRules {
    fn reload(&self) -> Result<Rules, String> {
        Self::shared(&self.files)
    }

    fn len(&self) -> usize {
        self.count
    }

    fn files(&self) -> &[PathBuf] {
        &self.files
    }

    fn evaluate(&self, facts: &Facts<'_>) -> Verdict {
        let request = match request(facts) {
            Ok(request) => request,
            Err(why) => {
                tracing::warn!(error = %why, "the request cannot be put to the authorization policies; denied");
                return Verdict::Deny {
                    policy: String::new(),
                };
            }
        };
        let entities = self.hierarchy(facts.action);
        let response = self
            .authorizer
            .is_authorized(&request, &self.set, &entities);
        let diagnostics = response.diagnostics();
        if let Some(error) = diagnostics.errors().next() {
            let cedar_policy::AuthorizationError::PolicyEvaluationError(e) = error;
            let policy = e.policy_id().to_string();
            tracing::warn!(policy, error = %error, "an authorization policy failed to evaluate; denied");
            return Verdict::Deny { policy };
        }
        let reasons: Vec<&PolicyId> = diagnostics.reason().collect();
        match response.decision() {
            Decision::Deny => Verdict::Deny {
                policy: reasons.first().map(|id| id.to_string()).unwrap_or_default(),
            },
            Decision::Allow => {
                let mut held: Vec<_> = reasons
                    .iter()
                    .filter_map(|id| {
                        let reason = self.set.policy(id)?.annotation("hold")?;
                        Some((id.to_string(), reason.to_owned()))
                    })
                    .collect();
                held.sort();
                match held.into_iter().next() {
                    Some((policy, reason)) => Verdict::Hold { policy, reason },
                    None => Verdict::Allow,
                }
            }
        }
    }
}

impl CedarRules {
    /// The entity hierarchy of `action`, from the cache when it holds it.
    fn hierarchy(&self, action: &str) -> Arc<Entities> {
        let read = self.hierarchies.read().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = read.get(action) {
            return found.clone();
        }
        let full = read.len() >= HIERARCHIES;
        drop(read);
        let built = Arc::new(action_entities(action));
        if !full {
            self.hierarchies
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(action.to_owned(), built.clone());
        }
        built
    }
}

fn uid(kind: &str, id: &str) -> Result<EntityUid, String> {
    let kind = EntityTypeName::from_str(kind).map_err(|e| e.to_string())?;
    Ok(EntityUid::from_type_name_and_id(kind, EntityId::new(id)))
}

fn request(facts: &Facts<'_>) -> Result<Request, String> {
    let mut context = vec![
        (
            "principal".to_owned(),
            RestrictedExpression::new_string(facts.principal.to_owned()),
        ),
        (
            "idempotency_key".to_owned(),
            RestrictedExpression::new_string(facts.idempotency_key.to_owned()),
        ),
        (
            "intent_id".to_owned(),
            RestrictedExpression::new_string(facts.intent_id.to_owned()),
        ),
    ];
    if let Some(params) = record(facts.params, Numbers::AsTyped) {
        context.push(("params".to_owned(), params));
    }
    if let Some(params) = record(facts.params, Numbers::AsDecimal) {
        context.push(("decimal_params".to_owned(), params));
    }
    let context = Context::from_pairs(context).map_err(|e| e.to_string())?;
    Request::new(
        uid("Agent", facts.agent_id)?,
        uid("Action", facts.action)?,
        uid("Run", facts.run_id)?,
        context,
        None,
    )
    .map_err(|e| e.to_string())
}

/// The action and its dotted prefixes as an entity hierarchy.
fn action_entities(action: &str) -> Entities {
    let mut entities = Vec::new();
    let mut name = action;
    while let Some((parent, _)) = name.rsplit_once('.') {
        if let (Ok(child), Ok(up)) = (uid("Action", name), uid("Action", parent)) {
            entities.push(Entity::new_no_attrs(child, HashSet::from([up])));
        }
        name = parent;
    }
    Entities::from_entities(entities, None).unwrap_or_else(|_| Entities::empty())
}

/// How a params record gives its numbers to Cedar.
#[derive(Clone, Copy)]
enum Numbers {
    /// Integers as `Long`, fractions as `decimal` (`context.params`).
    AsTyped,
    /// Every number that fits as a `decimal`, integers included (`context.decimal_params`).
    AsDecimal,
}

/// A params value as a Cedar value (`None` for `null`).
fn value(v: &serde_json::Value, numbers: Numbers) -> Option<RestrictedExpression> {
    use serde_json::Value as J;
    Some(match v {
        J::Null => return None,
        J::Bool(b) => RestrictedExpression::new_bool(*b),
        J::Number(n) => match (n.as_i64(), numbers) {
            (Some(i), Numbers::AsTyped) => RestrictedExpression::new_long(i),
            (Some(i), Numbers::AsDecimal) => number(&format!("{i}.0")),
            (None, _) => number(&n.to_string()),
        },
        J::String(s) => RestrictedExpression::new_string(s.clone()),
        J::Array(items) => {
            RestrictedExpression::new_set(items.iter().filter_map(|v| value(v, numbers)))
        }
        J::Object(members) => record(members, numbers)?,
    })
}

/// A params object as a Cedar record (`null` members left out).
fn record(
    members: &serde_json::Map<String, serde_json::Value>,
    numbers: Numbers,
) -> Option<RestrictedExpression> {
    RestrictedExpression::new_record(
        members
            .iter()
            .filter_map(|(k, v)| value(v, numbers).map(|v| (k.clone(), v))),
    )
    .ok()
}

/// A number with a point as a Cedar `decimal` when it has at most four places and fits, else its
/// text (which no `decimal` method accepts: a rule comparing it errors, and denies).
fn number(text: &str) -> RestrictedExpression {
    let fits = |s: &str| {
        let (int, frac) = s.split_once('.').unwrap_or((s, ""));
        !s.contains(['e', 'E'])
            && frac.len() <= 4
            && int.trim_start_matches('-').len() <= 14
            && !frac.is_empty()
    };
    if fits(text) {
        RestrictedExpression::new_decimal(text)
    } else {
        RestrictedExpression::new_string(text.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> CedarRules {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.cedar");
        std::fs::write(&path, text).unwrap();
        CedarRules::load(&[path]).unwrap()
    }

    fn facts<'a>(agent: &'a str, action: &'a str, params: &'a serde_json::Value) -> Facts<'a> {
        let params = params.as_object().expect("params are an object");
        Facts {
            principal: "worker",
            agent_id: agent,
            run_id: "r",
            action,
            idempotency_key: "",
            intent_id: "",
            params,
        }
    }

    const POLICIES: &str = r#"
        @id("all") permit(principal, action, resource);
        @id("no-intern") forbid(principal == Agent::"intern", action in Action::"payments", resource);
        @id("big") forbid(principal, action == Action::"payments.transfer", resource)
            when { context.params.amount > 1000 };
        @id("deletes") @hold("deletes need approval")
        permit(principal, action == Action::"files.delete", resource);
    "#;

    #[test]
    fn allow_deny_by_agent_and_param_and_hold() {
        let r = rules(POLICIES);
        let small = serde_json::json!({"amount": 10, "currency": "EUR"});
        let big = serde_json::json!({"amount": 5000});
        let fraction = serde_json::json!({"amount": 10.5});
        assert_eq!(
            r.evaluate(&facts("bot", "payments.transfer", &small)),
            Verdict::Allow
        );
        assert_eq!(
            r.evaluate(&facts("intern", "payments.transfer.eu", &small)),
            Verdict::Deny {
                policy: "no-intern".into()
            }
        );
        assert_eq!(
            r.evaluate(&facts("bot", "payments.transfer", &big)),
            Verdict::Deny {
                policy: "big".into()
            }
        );
        // 10.5 is a decimal: comparing it with `>` is a type error, and errors deny.
        assert_eq!(
            r.evaluate(&facts("bot", "payments.transfer", &fraction)),
            Verdict::Deny {
                policy: "big".into()
            }
        );
        assert_eq!(
            r.evaluate(&facts("bot", "files.delete", &small)),
            Verdict::Hold {
                policy: "deletes".into(),
                reason: "deletes need approval".into()
            }
        );
        let none = rules("");
        assert!(none.is_empty());
        assert_eq!(
            none.evaluate(&facts("bot", "x", &small)),
            Verdict::Deny {
                policy: String::new()
            }
        );
    }

    /// A ceiling on an amount that comes as `12` or `12.5`: on `decimal_params` it holds for both
    /// (on `params`, `>` errors for the fraction, and the error denies).
    #[test]
    fn decimal_params_compare_integers_and_fractions_alike() {
        let r = rules(
            r#"
            @id("all") permit(principal, action, resource);
            @id("ceiling") forbid(principal, action, resource) when {
                context.decimal_params has amount &&
                context.decimal_params.amount.greaterThan(decimal("10000.00"))
            };
        "#,
        );
        let verdict = |params: &str| {
            let params: serde_json::Value = serde_json::from_str(params).unwrap();
            r.evaluate(&facts("bot", "payments.transfer", &params))
        };
        let ceiling = Verdict::Deny {
            policy: "ceiling".into(),
        };
        for allowed in [
            r#"{"amount":12.5}"#,
            r#"{"amount":12}"#,
            r#"{"amount":10000}"#,
            r#"{"amount":10000.0}"#,
            r#"{"amount":-3}"#,
            r#"{"to":"DE89"}"#,
            r#"{"amount":null}"#,
        ] {
            assert_eq!(verdict(allowed), Verdict::Allow, "{allowed}");
        }
        for denied in [
            r#"{"amount":10000.01}"#,
            r#"{"amount":10001}"#,
            r#"{"amount":1e5}"#,
            // Not a decimal: text, which `greaterThan` refuses, so the rule errors and denies.
            r#"{"amount":"12.5"}"#,
            r#"{"amount":0.00001}"#,
            r#"{"amount":1000000000000000}"#,
        ] {
            assert_eq!(verdict(denied), ceiling, "{denied}");
        }
    }

    #[test]
    fn a_broken_file_says_what_cedar_says() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.cedar");
        std::fs::write(
            &path,
            "permit(principal, action, resource) when { context.x > };",
        )
        .unwrap();
        let err = CedarRules::load(&[path]).unwrap_err();
        assert!(err.contains("bad.cedar"), "{err}");
        assert!(err.contains("unexpected token"), "{err}");
    }
}
