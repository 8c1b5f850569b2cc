//! Approvals, pure: an action a rule holds waits for an operator. One approval per action key,
//! bound to the request hash it was asked for; approved, it covers the next identical grant once;
//! denied, it refuses identical requests; either way it lapses at `expires_at`.

use serde::{Deserialize, Serialize};

use super::Millis;

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApprovalState {
    Pending,
    Approved,
    Denied,
    /// Approved, then used by a grant: it covers nothing more.
    Used,
}

impl ApprovalState {
    /// The upper-case name the API and the audit use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Approved => "APPROVED",
            Self::Denied => "DENIED",
            Self::Used => "USED",
        }
    }
}

/// The stored approval of one action key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    pub id: String,
    /// The request hash it covers, and its field digests (to name differing fields).
    pub fingerprint: String,
    pub digests: String,
    pub state: ApprovalState,
    pub created_at: Millis,
    /// When it lapses (store clock); past it the approval does not exist.
    pub expires_at: Millis,
    /// The holding policy's id and its `@hold` text.
    pub policy: String,
    pub reason: String,
    /// The action type it was asked for.
    pub action: String,
    /// The operator who decided it, and their note.
    pub operator: String,
    pub note: String,
    /// The params of the request it covers, as the agent sent them (JSON text): what the
    /// approver decides on. Empty in approvals stored before it was kept.
    #[serde(default)]
    pub params: String,
}

/// A rule's hold on a request, as the gate passes it to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub policy: String,
    pub reason: String,
    /// The id a new approval takes.
    pub new_id: String,
    /// How long a new approval lives.
    pub ttl: Millis,
    pub action: String,
    /// The request's params, as sent (JSON text), kept with a new approval for the approver.
    pub params: String,
}

/// A pending approval as RequestToken answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub id: String,
    pub expires_at: Millis,
    pub policy: String,
    pub reason: String,
}

/// What a held request meets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Met {
    /// An approval for this request: the grant may proceed, and the approval becomes this.
    Covered(Approval),
    /// Still waiting (or a new approval asked for, to be stored): answer PENDING_APPROVAL.
    Wait {
        pending: Pending,
        store: Option<Approval>,
    },
    /// An operator denied this request.
    Denied { id: String },
    /// A live approval of this key is bound to another request (its digests).
    OtherRequest { digests: String },
}

/// A live approval: absent past its lapse.
pub fn live(approval: Option<&Approval>, now: Millis) -> Option<&Approval> {
    approval.filter(|a| a.expires_at > now)
}

/// What a request the rules hold meets, given the stored approval of its key.
pub fn meet(
    stored: Option<&Approval>,
    hold: &Hold,
    fingerprint: &str,
    digests: &str,
    now: Millis,
) -> Met {
    let current = live(stored, now).filter(|a| a.state != ApprovalState::Used);
    match current {
        Some(a) if a.fingerprint != fingerprint => Met::OtherRequest {
            digests: a.digests.clone(),
        },
        Some(a) => match a.state {
            ApprovalState::Approved => Met::Covered(Approval {
                state: ApprovalState::Used,
                ..a.clone()
            }),
            ApprovalState::Denied => Met::Denied { id: a.id.clone() },
            _ => Met::Wait {
                pending: pending(a),
                store: None,
            },
        },
        None => {
            let new = Approval {
                id: hold.new_id.clone(),
                fingerprint: fingerprint.to_owned(),
                digests: digests.to_owned(),
                state: ApprovalState::Pending,
                created_at: now,
                expires_at: now + hold.ttl,
                policy: hold.policy.clone(),
                reason: hold.reason.clone(),
                action: hold.action.clone(),
                operator: String::new(),
                note: String::new(),
                params: hold.params.clone(),
            };
            Met::Wait {
                pending: pending(&new),
                store: Some(new),
            }
        }
    }
}

fn pending(a: &Approval) -> Pending {
    Pending {
        id: a.id.clone(),
        expires_at: a.expires_at,
        policy: a.policy.clone(),
        reason: a.reason.clone(),
    }
}

/// An operator's decision on an approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub id: String,
    pub approve: bool,
    pub operator: String,
    pub note: String,
}

/// Why a decision was refused: the approval is not pending (its state, or `None` when there is
/// none with that id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotPending(pub Option<ApprovalState>);

/// The answer to a decision: the approval after it, and whether anything changed (`false`: the
/// same decision repeated).
pub type Decided = Result<(Approval, bool), NotPending>;

/// An operator approves or denies. Repeating the decision already made is a no-op; anything else
/// on an approval that is not pending is refused.
pub fn decide(stored: Option<&Approval>, decision: &Decision, now: Millis) -> Decided {
    let Some(a) = live(stored, now).filter(|a| a.id == decision.id) else {
        return Err(NotPending(None));
    };
    let target = if decision.approve {
        ApprovalState::Approved
    } else {
        ApprovalState::Denied
    };
    match a.state {
        ApprovalState::Pending => Ok((
            Approval {
                state: target,
                operator: decision.operator.clone(),
                note: decision.note.clone(),
                ..a.clone()
            },
            true,
        )),
        state if state == target => Ok((a.clone(), false)),
        state => Err(NotPending(Some(state))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(id: &str) -> Hold {
        Hold {
            policy: "deletes".into(),
            reason: "deletes need approval".into(),
            new_id: id.into(),
            ttl: 1_000,
            action: "files.delete".into(),
            params: r#"{"path":"/a"}"#.into(),
        }
    }

    fn decision(id: &str, approve: bool) -> Decision {
        Decision {
            id: id.into(),
            approve,
            operator: "ops".into(),
            note: String::new(),
        }
    }

    #[test]
    fn held_approved_used_once_then_asked_anew() {
        let Met::Wait {
            store: Some(first), ..
        } = meet(None, &hold("a1"), "fp", "", 0)
        else {
            panic!("a new hold waits")
        };
        assert!(matches!(
            meet(Some(&first), &hold("a2"), "fp", "", 10),
            Met::Wait { store: None, pending } if pending.id == "a1"
        ));
        let (approved, changed) = decide(Some(&first), &decision("a1", true), 20).unwrap();
        assert!(changed);
        assert_eq!(
            decide(Some(&approved), &decision("a1", true), 21),
            Ok((approved.clone(), false))
        );
        assert_eq!(
            decide(Some(&approved), &decision("a1", false), 21),
            Err(NotPending(Some(ApprovalState::Approved)))
        );
        let Met::Covered(used) = meet(Some(&approved), &hold("a3"), "fp", "", 30) else {
            panic!("approved covers")
        };
        assert_eq!(used.state, ApprovalState::Used);
        assert_eq!(
            decide(Some(&used), &decision("a1", true), 31),
            Err(NotPending(Some(ApprovalState::Used)))
        );
        assert!(matches!(
            meet(Some(&used), &hold("a4"), "fp", "", 40),
            Met::Wait { store: Some(new), .. } if new.id == "a4"
        ));
    }

    #[test]
    fn another_request_is_not_covered_denied_refuses_and_lapsed_is_gone() {
        let Met::Wait { store: Some(a), .. } = meet(None, &hold("a1"), "fp", "d1", 0) else {
            panic!()
        };
        assert_eq!(
            meet(Some(&a), &hold("a2"), "other", "d2", 1),
            Met::OtherRequest {
                digests: "d1".into()
            }
        );
        let (denied, _) = decide(Some(&a), &decision("a1", false), 2).unwrap();
        assert_eq!(
            meet(Some(&denied), &hold("a2"), "fp", "d1", 3),
            Met::Denied { id: "a1".into() }
        );
        assert_eq!(
            decide(Some(&a), &decision("a1", true), 1_000),
            Err(NotPending(None))
        );
        assert_eq!(
            decide(Some(&a), &decision("zz", true), 5),
            Err(NotPending(None))
        );
        assert!(matches!(
            meet(Some(&denied), &hold("a3"), "fp", "d1", 1_000),
            Met::Wait { store: Some(_), .. }
        ));
    }
}
