//! What one RequestToken came to, decided once: by a rule (a denial, before the store) or by the
//! store's atomic step (a grant, a replay, a hold, or a refusal). Everything after reads this one
//! value: the metrics and the audit line take its [`label`](TokenDecision::label) (one spelling
//! for both), shadow mode asks whether it [`is_grant`](TokenDecision::is_grant), signing signs its
//! grant, and [`into_outcome`](TokenDecision::into_outcome) is the answer the services send.

use oncegate_domain::{
    ActionKey,
    ledger::{Completion, Exceeded, Grant, GrantKind, Millis, Pending, Refusal, TokenOutcome},
};
use oncegate_observe::metrics::Decision;
use oncegate_store::StoreError;

use crate::GateError;

/// Every way a RequestToken can end once it is well formed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenDecision {
    /// A token: new, redelivered to its holder, or regranted after an unresolved lease.
    Granted { grant: Grant, kind: GrantKind },
    /// The action completed: its completion is the answer (nothing runs).
    Replayed(Completion),
    /// A rule holds it for an approval.
    Held(Pending),
    /// The same key with another request hash: the differing key fields.
    KeyReused { differing: Vec<String> },
    /// Another attempt holds a live lease, for `retry_after` more.
    InProgress { retry_after: Millis },
    /// An earlier attempt's lease ended with no outcome: `token` and `fencing` name the grant to
    /// reconcile, `expired_at` when it ended.
    LeaseExpired {
        token: String,
        fencing: u64,
        expired_at: Millis,
    },
    /// A budget would be exceeded: which, used and limit, and when enough frees up.
    BudgetExceeded(Exceeded),
    /// An operator denied the approval it needs.
    ApprovalDenied { id: String },
    /// A rule denies it (`policy`: the deciding policy; empty when none permits it).
    PolicyDenied { policy: String },
}

impl TokenDecision {
    /// The decision of the store's step. A refusal RequestToken never gives is a store that
    /// answered out of turn: `Corrupt`.
    pub fn from_step(result: Result<TokenOutcome, Refusal>) -> Result<Self, StoreError> {
        Ok(match result {
            Ok(TokenOutcome::Granted(grant, kind)) => Self::Granted { grant, kind },
            Ok(TokenOutcome::AlreadyCompleted(done)) => Self::Replayed(done),
            Ok(TokenOutcome::PendingApproval(pending)) => Self::Held(pending),
            Err(Refusal::KeyReused { differing }) => Self::KeyReused { differing },
            Err(Refusal::InProgress { retry_after }) => Self::InProgress { retry_after },
            Err(Refusal::LeaseExpired {
                token,
                fencing,
                expired_at,
            }) => Self::LeaseExpired {
                token,
                fencing,
                expired_at,
            },
            Err(Refusal::BudgetExceeded(exceeded)) => Self::BudgetExceeded(exceeded),
            Err(Refusal::ApprovalDenied { id }) => Self::ApprovalDenied { id },
            Err(other) => {
                return Err(StoreError::corrupt(format!(
                    "the store answered a RequestToken with {other:?}"
                )));
            }
        })
    }

    /// Its name: the `decision` label of `oncegate_attempts_total` and of the audit line.
    pub fn label(&self) -> Decision {
        match self {
            Self::Granted {
                kind: GrantKind::New,
                ..
            } => Decision::Granted,
            Self::Granted {
                kind: GrantKind::Redelivered,
                ..
            } => Decision::Redelivered,
            Self::Granted {
                kind: GrantKind::Regranted,
                ..
            } => Decision::Regranted,
            Self::Replayed(_) => Decision::Replayed,
            Self::Held(_) => Decision::PendingApproval,
            Self::KeyReused { .. } => Decision::KeyReused,
            Self::InProgress { .. } => Decision::InProgress,
            Self::LeaseExpired { .. } => Decision::LeaseExpired,
            Self::BudgetExceeded(_) => Decision::BudgetExceeded,
            Self::ApprovalDenied { .. } => Decision::ApprovalDenied,
            Self::PolicyDenied { .. } => Decision::PolicyDenied,
        }
    }

    /// True for a token handed out.
    pub fn is_grant(&self) -> bool {
        matches!(self, Self::Granted { .. })
    }

    /// True for a grant that wrote a new token (new or regranted): what budgets charge.
    pub fn is_new_token(&self) -> bool {
        matches!(
            self,
            Self::Granted {
                kind: GrantKind::New | GrantKind::Regranted,
                ..
            }
        )
    }

    /// The fencing number the decision names (the grant's, the completion's, the expired grant's).
    pub fn fencing(&self) -> Option<u64> {
        match self {
            Self::Granted { grant, .. } => Some(grant.fencing),
            Self::Replayed(done) => Some(done.fencing),
            Self::LeaseExpired { fencing, .. } => Some(*fencing),
            _ => None,
        }
    }

    /// The answer for the caller: a grant, a replay or a hold, or the error the wire shows (a
    /// lease expired unresolved carries the action, so that the answer names everything settling
    /// it needs).
    pub fn into_outcome(self, key: &ActionKey) -> Result<TokenOutcome, GateError> {
        let refused = GateError::Refused;
        match self {
            Self::Granted { grant, kind } => Ok(TokenOutcome::Granted(grant, kind)),
            Self::Replayed(done) => Ok(TokenOutcome::AlreadyCompleted(done)),
            Self::Held(pending) => Ok(TokenOutcome::PendingApproval(pending)),
            Self::KeyReused { differing } => Err(refused(Refusal::KeyReused { differing })),
            Self::InProgress { retry_after } => Err(refused(Refusal::InProgress { retry_after })),
            Self::LeaseExpired {
                token,
                fencing,
                expired_at,
            } => Err(GateError::Unresolved {
                key: Box::new(key.clone()),
                refusal: Refusal::LeaseExpired {
                    token,
                    fencing,
                    expired_at,
                },
            }),
            Self::BudgetExceeded(exceeded) => Err(refused(Refusal::BudgetExceeded(exceeded))),
            Self::ApprovalDenied { id } => Err(refused(Refusal::ApprovalDenied { id })),
            Self::PolicyDenied { policy } => Err(GateError::PolicyDenied { policy }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(kind: GrantKind) -> TokenDecision {
        TokenDecision::Granted {
            grant: Grant {
                token: "t".into(),
                fencing: 7,
                lease_expires_at: 10,
            },
            kind,
        }
    }

    #[test]
    fn every_label_is_a_metrics_decision_and_names_agree() {
        let decisions = [
            grant(GrantKind::New),
            grant(GrantKind::Redelivered),
            grant(GrantKind::Regranted),
            TokenDecision::KeyReused { differing: vec![] },
            TokenDecision::InProgress { retry_after: 1 },
            TokenDecision::BudgetExceeded(Exceeded {
                budget: "b".into(),
                retry_after: None,
                used: 9,
                limit: 10,
                requested: 2,
            }),
            TokenDecision::ApprovalDenied { id: "a".into() },
            TokenDecision::PolicyDenied { policy: "p".into() },
        ];
        let names: Vec<&str> = decisions.iter().map(|d| d.label().as_str()).collect();
        assert_eq!(
            names,
            [
                "granted",
                "redelivered",
                "regranted",
                "key_reused",
                "in_progress",
                "budget_exceeded",
                "approval_denied",
                "policy_denied"
            ]
        );
        for d in &decisions {
            assert!(Decision::ALL.contains(&d.label()));
        }
    }

    #[test]
    fn a_refusal_requesttoken_never_gives_is_a_store_fault() {
        let e = TokenDecision::from_step(Err(Refusal::TokenMismatch)).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
    }

    #[test]
    fn an_unresolved_lease_answers_with_its_action() {
        let key = ActionKey::new("a", "r", "k");
        let decision = TokenDecision::LeaseExpired {
            token: "t".into(),
            fencing: 3,
            expired_at: 9,
        };
        match decision.into_outcome(&key) {
            Err(GateError::Unresolved { key: named, .. }) => assert_eq!(*named, key),
            other => panic!("{other:?}"),
        }
    }
}
