//! Why a store call failed ([`StoreError`]), with its cause kept: the one error type every store
//! returns. Client mistakes are never store errors (they are the ledger's refusals).

/// A cause kept as the source of a [`StoreError`].
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why a store call failed. Client mistakes are never store errors: they are [`Refusal`](oncegate_domain::ledger::Refusal)s. The
/// message says what failed, the cause included; [`std::error::Error::source`] still gives the cause.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time. Fail closed, retry later.
    #[error("store unavailable: {what}{}", caused(source))]
    Unavailable {
        what: String,
        #[source]
        source: Option<Cause>,
    },
    /// A stored value this version cannot read (this action's record, its approval or budget, its
    /// agent's receipt chain), or a store that answered with something it should not. Nothing was
    /// written; the store keeps serving every other action.
    #[error("store returned an unreadable record: {what}{}", caused(source))]
    Corrupt {
        what: String,
        #[source]
        source: Option<Cause>,
    },
    /// The store is set up so that it could lose records (a Redis that may evict keys). Start-up
    /// refuses it; seen later, calls fail closed as `Unavailable` instead.
    #[error("store misconfigured: {0}")]
    Misconfigured(String),
}

fn caused(source: &Option<Cause>) -> String {
    source
        .as_ref()
        .map(|e| format!(": {e}"))
        .unwrap_or_default()
}

impl StoreError {
    /// The store could not be reached or did not answer (`what` says which).
    pub fn unavailable(what: impl Into<String>) -> Self {
        Self::Unavailable {
            what: what.into(),
            source: None,
        }
    }

    /// The store could not be reached, because of `cause`.
    pub fn unavailable_by(what: impl Into<String>, cause: impl Into<Cause>) -> Self {
        Self::Unavailable {
            what: what.into(),
            source: Some(cause.into()),
        }
    }

    /// A stored value that cannot be read (`what` says which).
    pub fn corrupt(what: impl Into<String>) -> Self {
        Self::Corrupt {
            what: what.into(),
            source: None,
        }
    }

    /// A stored value that cannot be read, because of `cause`.
    pub fn corrupt_by(what: impl Into<String>, cause: impl Into<Cause>) -> Self {
        Self::Corrupt {
            what: what.into(),
            source: Some(cause.into()),
        }
    }

    /// The kind of failure, as the metrics label it: `unavailable`, `corrupt` or `misconfigured`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unavailable { .. } => "unavailable",
            Self::Corrupt { .. } => "corrupt",
            Self::Misconfigured(_) => "misconfigured",
        }
    }
}
