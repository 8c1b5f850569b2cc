//! Who may do what: the principals of the config file, how a call proves it is one of them, what
//! each may act on, and its rate limit.
//!
//! Authentication happens in one place, [`Authenticator`] (a tonic interceptor in front of both
//! gate services), which resolves the caller to a [`Principal`] and puts it in the request's
//! extensions. The scope check needs the request body, so the services make it, through
//! [`Principal::authorize`], before touching the store. Health and reflection are not behind the
//! interceptor: Kubernetes probes health without credentials, and reflection only describes the
//! public contract.
//!
//! Credentials: an API key sent as `authorization: Bearer <key>` (only its SHA-256 is configured,
//! and the comparison is constant-time over every principal), or, under mutual TLS, a client
//! certificate whose subject CN or a SAN equals a principal's `cert_identity`. A call that sends
//! an `authorization` header is judged by it alone: a wrong key is refused even with a valid
//! certificate. Keys are never logged.

use std::{collections::HashSet, num::NonZeroU32, sync::Arc, time::Duration};

use governor::{
    DefaultDirectRateLimiter, Quota, RateLimiter,
    clock::{Clock as _, DefaultClock},
};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::{Request, Status, service::Interceptor};

use super::tls;
use crate::gate::GateError;

/// What a principal is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A worker: the gate RPCs, for its agents only.
    Agent,
    /// A person or tool that settles what needs a human: every RPC, including GateAdminService,
    /// for its agents (every agent when `agents` is unset).
    Operator,
}

/// One `[[principals]]` entry of the config file, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalConfig {
    /// Unique name, shown in audit events and errors.
    pub name: String,
    /// `agent` or `operator`.
    pub role: Role,
    /// Agent ids it may act for: exact ids, `prefix*` patterns, or `*`. Required for agents;
    /// operators act for every agent when unset.
    pub agents: Option<Vec<String>>,
    /// Lowercase hex SHA-256 of its API key (`oncegate hash-key` prints it).
    pub api_key_sha256: Option<String>,
    /// Subject CN or SAN (DNS, URI, e-mail) of its client certificate, under mutual TLS.
    pub cert_identity: Option<String>,
    /// Sustained calls per second it may make (unlimited when unset).
    pub rate_limit_per_second: Option<f64>,
    /// Calls it may make at once above the sustained rate (default: one second's worth).
    pub burst: Option<u32>,
}

/// The agent ids a principal may act for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Agents {
    All,
    Some {
        exact: HashSet<String>,
        prefixes: Vec<String>,
    },
}

impl Agents {
    fn parse(patterns: &[String]) -> Self {
        if patterns.iter().any(|p| p == "*") {
            return Self::All;
        }
        let (prefixes, exact): (Vec<_>, Vec<_>) = patterns.iter().partition(|p| p.ends_with('*'));
        Self::Some {
            exact: exact.into_iter().cloned().collect(),
            prefixes: prefixes
                .into_iter()
                .map(|p| p.trim_end_matches('*').to_owned())
                .collect(),
        }
    }

    fn allows(&self, agent_id: &str) -> bool {
        match self {
            Self::All => true,
            Self::Some { exact, prefixes } => {
                exact.contains(agent_id) || prefixes.iter().any(|p| agent_id.starts_with(p))
            }
        }
    }
}

/// An authenticated caller.
#[derive(Debug)]
pub struct Principal {
    /// The configured name (`anonymous` on an open gate).
    pub name: String,
    pub role: Role,
    agents: Agents,
    limiter: Option<DefaultDirectRateLimiter>,
}

impl Principal {
    /// The caller of a gate configured without principals (open, loopback only unless
    /// `--insecure`): may do everything.
    pub fn anonymous() -> Self {
        Self {
            name: "anonymous".into(),
            role: Role::Operator,
            agents: Agents::All,
            limiter: None,
        }
    }

    /// Whether it may act for `agent_id`.
    pub fn may_act_for(&self, agent_id: &str) -> bool {
        self.agents.allows(agent_id)
    }

    /// Whether it may act for every agent (list unresolved actions without naming an agent).
    pub fn acts_for_all(&self) -> bool {
        self.agents == Agents::All
    }

    /// The scope check: `FORBIDDEN_SCOPE` unless it may act for `agent_id` (and, for an
    /// operator-only RPC, is an operator). Decided before any store call, so a refused caller
    /// learns nothing about the action.
    pub fn authorize(&self, agent_id: &str, operator_only: bool) -> Result<(), GateError> {
        let role_ok = !operator_only || self.role == Role::Operator;
        if role_ok && self.may_act_for(agent_id) {
            Ok(())
        } else {
            Err(self.forbidden())
        }
    }

    /// `FORBIDDEN_SCOPE` for this principal.
    pub fn forbidden(&self) -> GateError {
        GateError::ForbiddenScope {
            principal: self.name.clone(),
        }
    }

    fn check_rate(&self) -> Result<(), GateError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        limiter.check().map_err(|not_until| GateError::RateLimited {
            retry_after: not_until.wait_time_from(DefaultClock::default().now()),
        })
    }
}

/// Every configured principal, validated. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Principals {
    entries: Arc<Vec<Entry>>,
}

#[derive(Debug)]
struct Entry {
    principal: Arc<Principal>,
    key_sha256: Option<[u8; 32]>,
    cert_identity: Option<String>,
}

impl Principals {
    /// Validates the `[[principals]]` entries: unique names and credentials, a credential each,
    /// agents for agent principals, well-formed hashes and rates.
    pub fn from_config(configs: &[PrincipalConfig]) -> Result<Self, String> {
        let mut names = HashSet::new();
        let mut keys = HashSet::new();
        let mut identities = HashSet::new();
        let mut entries = Vec::with_capacity(configs.len());
        for (i, c) in configs.iter().enumerate() {
            let at = format!("principals[{i}] ({:?})", c.name);
            if c.name.is_empty() || !names.insert(c.name.clone()) {
                return Err(format!("{at}: name must be non-empty and unique"));
            }
            let key_sha256 = c
                .api_key_sha256
                .as_deref()
                .map(|h| {
                    parse_sha256(h).ok_or(format!(
                        "{at}: api_key_sha256 must be 64 hex digits (oncegate hash-key prints it)"
                    ))
                })
                .transpose()?;
            if key_sha256.is_some_and(|k| !keys.insert(k)) {
                return Err(format!(
                    "{at}: another principal has the same api_key_sha256"
                ));
            }
            if let Some(id) = &c.cert_identity
                && (id.is_empty() || !identities.insert(id.clone()))
            {
                return Err(format!("{at}: cert_identity must be non-empty and unique"));
            }
            if key_sha256.is_none() && c.cert_identity.is_none() {
                return Err(format!("{at}: needs api_key_sha256 or cert_identity"));
            }
            let agents = match (&c.agents, c.role) {
                (Some(list), _) if !list.is_empty() && list.iter().all(|a| !a.is_empty()) => {
                    Agents::parse(list)
                }
                (None, Role::Operator) => Agents::All,
                _ => {
                    return Err(format!(
                        "{at}: agents must list at least one non-empty agent id or pattern"
                    ));
                }
            };
            let limiter = match (c.rate_limit_per_second, c.burst) {
                (None, None) => None,
                (None, Some(_)) => return Err(format!("{at}: burst needs rate_limit_per_second")),
                (Some(rate), burst) => {
                    Some(limiter(rate, burst).map_err(|e| format!("{at}: {e}"))?)
                }
            };
            entries.push(Entry {
                principal: Arc::new(Principal {
                    name: c.name.clone(),
                    role: c.role,
                    agents,
                    limiter,
                }),
                key_sha256,
                cert_identity: c.cert_identity.clone(),
            });
        }
        Ok(Self {
            entries: Arc::new(entries),
        })
    }

    /// True when none are configured (the gate is open; see README "Security model").
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The principal whose key hash matches `key`. Every entry is compared, in constant time, so
    /// timing tells nothing about which (or whether a) principal matched.
    pub fn by_api_key(&self, key: &str) -> Option<Arc<Principal>> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let mut found = None;
        for entry in self.entries.iter() {
            if let Some(stored) = &entry.key_sha256
                && bool::from(stored.ct_eq(&digest))
            {
                found = Some(entry.principal.clone());
            }
        }
        found
    }

    /// The principal whose `cert_identity` is one of a verified client certificate's identities.
    pub fn by_cert_identity(&self, identities: &[String]) -> Option<Arc<Principal>> {
        self.entries
            .iter()
            .find(|e| {
                e.cert_identity
                    .as_ref()
                    .is_some_and(|id| identities.iter().any(|i| i == id))
            })
            .map(|e| e.principal.clone())
    }
}

fn parse_sha256(hex_digest: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(hex_digest.trim().to_ascii_lowercase()).ok()?;
    bytes.try_into().ok()
}

fn limiter(rate: f64, burst: Option<u32>) -> Result<DefaultDirectRateLimiter, String> {
    if !(rate.is_finite() && rate > 0.0 && rate <= 1_000_000.0) {
        return Err(format!(
            "rate_limit_per_second must be in (0, 1000000], got {rate}"
        ));
    }
    let burst = burst.unwrap_or_else(|| rate.ceil() as u32);
    let burst = NonZeroU32::new(burst).ok_or("burst must be at least 1")?;
    let quota = Quota::with_period(Duration::from_secs_f64(1.0 / rate))
        .ok_or("rate_limit_per_second is too high")?
        .allow_burst(burst);
    Ok(RateLimiter::direct(quota))
}

/// SHA-256 of an API key, lowercase hex: what `api_key_sha256` holds.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// The principal a call was authenticated as, in the request's extensions.
#[derive(Debug, Clone)]
pub struct Authenticated(pub Arc<Principal>);

/// The principal of a request that went through [`Authenticator`].
pub fn principal<T>(request: &Request<T>) -> Result<Arc<Principal>, GateError> {
    request
        .extensions()
        .get::<Authenticated>()
        .map(|a| a.0.clone())
        .ok_or(GateError::Unauthenticated)
}

/// The interceptor in front of the gate services: resolves the caller, applies its rate limit,
/// and records it in the request's extensions.
#[derive(Debug, Clone)]
pub struct Authenticator {
    principals: Principals,
    anonymous: Arc<Principal>,
}

impl Authenticator {
    /// With no principals every call is [`Principal::anonymous`].
    pub fn new(principals: Principals) -> Self {
        Self {
            principals,
            anonymous: Arc::new(Principal::anonymous()),
        }
    }

    /// Resolves the caller of `request`.
    pub fn authenticate<T>(&self, request: &Request<T>) -> Result<Arc<Principal>, GateError> {
        if self.principals.is_empty() {
            return Ok(self.anonymous.clone());
        }
        if let Some(header) = request.metadata().get("authorization") {
            let key = header
                .to_str()
                .ok()
                .and_then(bearer)
                .ok_or(GateError::Unauthenticated)?;
            return self
                .principals
                .by_api_key(key)
                .ok_or(GateError::Unauthenticated);
        }
        request
            .peer_certs()
            .and_then(|certs| certs.first().map(|leaf| tls::identities(leaf.as_ref())))
            .and_then(|ids| self.principals.by_cert_identity(&ids))
            .ok_or(GateError::Unauthenticated)
    }
}

/// The key of an `authorization: Bearer <key>` value (scheme case-insensitive).
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, key) = value.trim().split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
}

impl Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let principal = self.authenticate(&request).inspect_err(|_| {
            tracing::info!(target: crate::observe::telemetry::AUDIT, decision = "unauthenticated", "refused");
        })?;
        principal.check_rate().inspect_err(|_| {
            tracing::info!(target: crate::observe::telemetry::AUDIT, principal = %principal.name, decision = "rate_limited", "refused");
        })?;
        request.extensions_mut().insert(Authenticated(principal));
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml_text: &str) -> Result<Principals, String> {
        #[derive(Deserialize)]
        struct File {
            principals: Vec<PrincipalConfig>,
        }
        let file: File = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        Principals::from_config(&file.principals)
    }

    #[test]
    fn keys_are_matched_by_hash_and_patterns_scope_agents() {
        let p = config(&format!(
            r#"
            [[principals]]
            name = "billing"
            role = "agent"
            agents = ["billing-*", "ledger"]
            api_key_sha256 = "{}"
            [[principals]]
            name = "ops"
            role = "operator"
            cert_identity = "ops.example"
            "#,
            hash_key("k1")
        ))
        .unwrap();
        let billing = p.by_api_key("k1").unwrap();
        assert_eq!(billing.name, "billing");
        assert!(p.by_api_key("k2").is_none());
        assert!(billing.may_act_for("billing-eu") && billing.may_act_for("ledger"));
        assert!(!billing.may_act_for("ledger-2") && !billing.may_act_for("bill"));
        assert!(
            billing.authorize("billing-eu", true).is_err(),
            "agents are not operators"
        );
        let ops = p
            .by_cert_identity(&["x".into(), "ops.example".into()])
            .unwrap();
        assert!(ops.acts_for_all() && ops.authorize("anything", true).is_ok());
    }

    #[test]
    fn bad_principals_say_what_is_wrong() {
        let h = hash_key("k");
        for (text, needle) in [
            (
                "name = \"a\"\nrole = \"agent\"\nagents = [\"x\"]",
                "needs api_key_sha256",
            ),
            (
                &format!("name = \"a\"\nrole = \"agent\"\napi_key_sha256 = \"{h}\""),
                "agents must list",
            ),
            (
                "name = \"a\"\nrole = \"operator\"\napi_key_sha256 = \"abc\"",
                "64 hex",
            ),
            (
                &format!(
                    "name = \"a\"\nrole = \"operator\"\napi_key_sha256 = \"{h}\"\nrate_limit_per_second = 0"
                ),
                "rate_limit",
            ),
            (
                &format!("name = \"a\"\nrole = \"operator\"\napi_key_sha256 = \"{h}\"\nburst = 3"),
                "burst needs",
            ),
            (
                "name = \"a\"\nrole = \"admin\"\ncert_identity = \"x\"",
                "unknown variant",
            ),
        ] {
            let err = config(&format!("[[principals]]\n{text}")).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
        let dup = format!(
            "[[principals]]\nname = \"a\"\nrole = \"operator\"\napi_key_sha256 = \"{h}\"\n[[principals]]\nname = \"b\"\nrole = \"operator\"\napi_key_sha256 = \"{h}\""
        );
        assert!(config(&dup).unwrap_err().contains("same api_key_sha256"));
    }

    #[test]
    fn bearer_values() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("abc"), None);
    }

    #[test]
    fn rate_limit_spends_the_burst_then_says_when() {
        let limiter = limiter(1.0, Some(2)).unwrap();
        let principal = Principal {
            name: "p".into(),
            role: Role::Agent,
            agents: Agents::All,
            limiter: Some(limiter),
        };
        assert!(principal.check_rate().is_ok());
        assert!(principal.check_rate().is_ok());
        match principal.check_rate() {
            Err(GateError::RateLimited { retry_after }) => {
                assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(1))
            }
            other => panic!("expected a rate limit, got {other:?}"),
        }
    }
}
