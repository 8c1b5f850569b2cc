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

mod login;
mod principal;
mod principals;

use std::sync::Arc;

use tonic::{Request, Status, service::Interceptor};

pub use login::{LOGIN_CODE_TTL, LoginCode, LoginCodes};
pub use principal::{ANONYMOUS, Capability, LOCAL_OPERATOR, Principal, Role};
pub use principals::{PrincipalConfig, Principals, hash_key};

use super::{status::status, tls};
use oncegate_gate::GateError;

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

    /// The admin socket's: every call is [`Principal::local_operator`] (the socket's file mode
    /// is the credential).
    pub fn local() -> Self {
        Self {
            principals: Principals::default(),
            anonymous: Arc::new(Principal::local_operator()),
        }
    }

    /// Resolves the caller of `request`. A call with no credential is [`Principal::anonymous`]
    /// (an agent for every agent) while no principal has the agent role: operators and approvers
    /// added to an open gate do not lock its agents out.
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
        let by_certificate = request
            .peer_certs()
            .and_then(|certs| certs.first().map(|leaf| tls::identities(leaf.as_ref())))
            .and_then(|ids| self.principals.by_cert_identity(&ids));
        match by_certificate {
            Some(principal) => Ok(principal),
            None if !self.principals.has_agents() => Ok(self.anonymous.clone()),
            None => Err(GateError::Unauthenticated),
        }
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
            tracing::info!(target: oncegate_observe::telemetry::AUDIT, decision = "unauthenticated", "refused");
        }).map_err(status)?;
        rate_checked(&principal)?;
        request.extensions_mut().insert(Authenticated(principal));
        Ok(request)
    }
}

/// One call of a session, as the interceptor would have let it in: `principal` authenticated
/// when the session opened, its rate limit taken for this call.
pub fn session_call<T>(principal: &Arc<Principal>, message: T) -> Result<Request<T>, Status> {
    rate_checked(principal)?;
    let mut request = Request::new(message);
    request
        .extensions_mut()
        .insert(Authenticated(principal.clone()));
    Ok(request)
}

/// Takes one call from `principal`'s rate limit, or refuses it (with its audit line).
fn rate_checked(principal: &Arc<Principal>) -> Result<(), Status> {
    principal.check_rate().inspect_err(|_| {
        tracing::info!(target: oncegate_observe::telemetry::AUDIT, principal = %principal.name, decision = "rate_limited", "refused");
    }).map_err(status)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{principal::Patterns, principals::limiter, *};
    use serde::Deserialize;

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
            billing.authorize("billing-eu", Capability::Settle).is_err(),
            "agents are not operators"
        );
        let ops = p
            .by_cert_identity(&["x".into(), "ops.example".into()])
            .unwrap();
        assert!(ops.acts_for_all() && ops.authorize("anything", Capability::Settle).is_ok());
    }

    #[test]
    fn an_approver_decides_approvals_and_nothing_else() {
        let p = config(&format!(
            r#"
            [[principals]]
            name = "finance-lead"
            role = "approver"
            agents = ["billing-*"]
            api_key_sha256 = "{}"
            "#,
            hash_key("k1")
        ))
        .unwrap();
        let lead = p.by_api_key("k1").unwrap();
        assert!(lead.authorize("billing-eu", Capability::Approve).is_ok());
        for what in [Capability::Work, Capability::Settle, Capability::Read] {
            let refused = lead.authorize("billing-eu", what).unwrap_err().to_string();
            assert!(
                refused.contains("role is approver") && refused.contains("needs the"),
                "{refused}"
            );
        }
        let elsewhere = lead.authorize("hr-1", Capability::Approve).unwrap_err();
        assert!(elsewhere.to_string().contains("\"hr-1\""), "{elsewhere}");
    }

    #[test]
    fn a_resolver_watches_and_settles_and_nothing_else() {
        let p = config(&format!(
            r#"
            [[principals]]
            name = "bank-resolver"
            role = "resolver"
            agents = ["billing-*"]
            api_key_sha256 = "{}"
            "#,
            hash_key("k1")
        ))
        .unwrap();
        let resolver = p.by_api_key("k1").unwrap();
        assert!(
            resolver
                .authorize("billing-eu", Capability::Resolve)
                .is_ok()
        );
        for what in [
            Capability::Work,
            Capability::Settle,
            Capability::Read,
            Capability::Approve,
        ] {
            let refused = resolver
                .authorize("billing-eu", what)
                .unwrap_err()
                .to_string();
            assert!(refused.contains("role is resolver"), "{refused}");
        }
        assert!(resolver.authorize("hr-1", Capability::Resolve).is_err());
        assert!(resolver.authorize_all(Capability::Resolve).is_err());
        assert!(!resolver.scoped_by_action() && resolver.may_settle_action("anything"));
    }

    #[test]
    fn a_resolvers_actions_scope_the_types_it_settles() {
        let p = config(&format!(
            r#"
            [[principals]]
            name = "bank-resolver"
            role = "resolver"
            actions = ["payments.*", "refunds.create"]
            api_key_sha256 = "{}"
            "#,
            hash_key("k1")
        ))
        .unwrap();
        let resolver = p.by_api_key("k1").unwrap();
        assert!(resolver.scoped_by_action());
        assert!(resolver.may_settle_action("payments.transfer"));
        assert!(resolver.may_settle_action("refunds.create"));
        for outside in ["refunds.create2", "mail.send", "payments", ""] {
            assert!(!resolver.may_settle_action(outside), "{outside:?}");
        }
        let why = resolver.forbid_action("mail.send").to_string();
        assert!(
            why.contains("\"mail.send\"") && why.contains("`actions`"),
            "{why}"
        );
    }

    #[test]
    fn an_anonymous_refusal_says_what_to_configure() {
        let refused = Principal::anonymous()
            .authorize("billing", Capability::Settle)
            .unwrap_err()
            .to_string();
        for needle in [
            "admin.sock",
            "[[principals]]",
            "role = \"operator\"",
            "--api-key",
        ] {
            assert!(refused.contains(needle), "{needle}: {refused}");
        }
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
            (
                &format!(
                    "name = \"a\"\nrole = \"operator\"\napi_key_sha256 = \"{h}\"\nactions = [\"x\"]"
                ),
                "actions scopes a resolver only",
            ),
            (
                &format!(
                    "name = \"a\"\nrole = \"resolver\"\napi_key_sha256 = \"{h}\"\nactions = []"
                ),
                "actions must list",
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
            agents: Patterns::All,
            actions: Patterns::All,
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
