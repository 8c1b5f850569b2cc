//! Shadow grants: what the gate hands out in shadow mode where enforcement would have refused
//! (or replayed, or held). The decision was counted and audited as enforcement would have made
//! it; the worker gets a grant anyway, whose token is not recorded anywhere: Complete, Release and
//! ExtendLease with it answer at once and touch no store, so shadow mode never changes what the
//! store holds beyond what enforcement would have written.
//!
//! A shadow token is `shadow-<fencing>-<uuid>`: the prefix cannot be a real token (32 hex
//! characters), and the fencing number (the gate's clock in µs) lets a Complete answer with it.

use super::{Gate, TokenAnswer, audit, request};
use oncegate_domain::{
    ActionKey,
    ledger::{
        CompleteOutcome, Completion, Grant, GrantKind, Millis, ReceiptFormat, Source, TokenOutcome,
        TokenRequest, first_fencing,
    },
};

const PREFIX: &str = "shadow-";

/// The gate's clock: shadow grants never reach the store, so they cannot use its clock.
pub(super) fn now() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

/// The fencing number of a shadow token, or `None` when the token is a real one.
fn fencing(token: &str) -> Option<u64> {
    let rest = token.strip_prefix(PREFIX)?;
    rest.split_once('-')?.0.parse().ok()
}

impl Gate {
    /// A shadow grant for a request enforcement would not have granted.
    pub(super) fn shadow_grant(&self, key: ActionKey, request: &TokenRequest) -> TokenAnswer {
        let now = now();
        let fencing = first_fencing(now);
        let token = format!("{PREFIX}{fencing}-{}", request::new_token());
        audit::shadow_granted(&key, fencing);
        TokenAnswer {
            provider_key: key.provider_key(),
            key,
            fingerprint: request.fingerprint.clone(),
            outcome: TokenOutcome::Granted(
                Grant {
                    token,
                    fencing,
                    lease_expires_at: now + request.lease,
                },
                GrantKind::New,
            ),
            replicas_acknowledged: 0,
            statement: String::new(),
            shadow: true,
        }
    }
}

/// Complete with a shadow token: a completion that is not recorded.
pub(super) fn complete(key: &ActionKey, token: &str, receipt: &[u8]) -> Option<CompleteOutcome> {
    let fencing = fencing(token)?;
    audit::shadow_call("complete", key, fencing);
    Some(CompleteOutcome {
        completion: Completion {
            receipt: receipt.to_vec(),
            completed_at: now(),
            fencing,
            token: token.to_owned(),
            source: Source::Worker,
            note: String::new(),
            operator: String::new(),
            seq: 0,
            statement: String::new(),
            format: ReceiptFormat::Unspecified,
        },
        recorded: false,
        double_execution: false,
    })
}

/// Release with a shadow token: nothing to give back.
pub(super) fn release(key: &ActionKey, token: &str) -> Option<u64> {
    let fencing = fencing(token)?;
    audit::shadow_call("release", key, fencing);
    Some(fencing)
}

/// ExtendLease with a shadow token: the new expiry, recorded nowhere.
pub(super) fn extend(key: &ActionKey, token: &str, ttl: Millis) -> Option<Millis> {
    let fencing = fencing(token)?;
    audit::shadow_call("extend_lease", key, fencing);
    Some(now() + ttl)
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_shadow_tokens_are_shadow() {
        assert_eq!(super::fencing("shadow-17-abc"), Some(17));
        assert_eq!(super::fencing("0123456789abcdef0123456789abcdef"), None);
        assert_eq!(super::fencing("shadow-x-abc"), None);
    }
}
