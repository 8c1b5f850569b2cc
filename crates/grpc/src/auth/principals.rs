//! The `[[principals]]` of the configuration file, validated into the table the authenticator
//! looks callers up in (API key hashes compared in constant time, certificate identities).

use std::{collections::HashSet, num::NonZeroU32, sync::Arc, time::Duration};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::principal::{Patterns, Principal, Role};

/// One `[[principals]]` entry of the config file, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalConfig {
    /// Unique name, shown in audit events and errors.
    pub name: String,
    /// `agent`, `operator`, `approver` or `resolver`.
    pub role: Role,
    /// Agent ids it may act for: exact ids, `prefix*` patterns, or `*`. Required for agents;
    /// operators, approvers and resolvers act for every agent when unset.
    pub agents: Option<Vec<String>>,
    /// Action types a resolver may watch and settle: exact types, `prefix*` patterns, or `*`
    /// (every type when unset). Only for resolvers.
    pub actions: Option<Vec<String>>,
    /// Lowercase hex SHA-256 of its API key (`oncegate hash-key` prints it).
    pub api_key_sha256: Option<String>,
    /// Subject CN or SAN (DNS, URI, e-mail) of its client certificate, under mutual TLS.
    pub cert_identity: Option<String>,
    /// Sustained calls per second it may make (unlimited when unset).
    pub rate_limit_per_second: Option<f64>,
    /// Calls it may make at once above the sustained rate (default: one second's worth).
    pub burst: Option<u32>,
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
                    Patterns::parse(list)
                }
                (None, Role::Operator | Role::Approver | Role::Resolver) => Patterns::All,
                _ => {
                    return Err(format!(
                        "{at}: agents must list at least one non-empty agent id or pattern"
                    ));
                }
            };
            let actions = match (&c.actions, c.role) {
                (None, _) => Patterns::All,
                (Some(list), Role::Resolver)
                    if !list.is_empty() && list.iter().all(|a| !a.is_empty()) =>
                {
                    Patterns::parse(list)
                }
                (Some(_), Role::Resolver) => {
                    return Err(format!(
                        "{at}: actions must list at least one non-empty action type or pattern"
                    ));
                }
                (Some(_), role) => {
                    return Err(format!(
                        "{at}: actions scopes a resolver only (this principal's role is {}); \
                         remove it",
                        role.as_str()
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
                    actions,
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

    /// True when none are configured (the gate is open; see docs/security.md).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True when some principal has the agent role. Until one has, agents call without a
    /// credential (as on an open gate): configuring operators or approvers never locks agents out.
    pub fn has_agents(&self) -> bool {
        self.entries.iter().any(|e| e.principal.role == Role::Agent)
    }

    /// How many are configured.
    pub fn len(&self) -> usize {
        self.entries.len()
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

pub(super) fn limiter(rate: f64, burst: Option<u32>) -> Result<DefaultDirectRateLimiter, String> {
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
