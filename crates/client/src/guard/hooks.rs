//! [`GuardHooks`]: what a caller of the guard decides where the defaults of
//! [`GateClient::run_once`](crate::GateClient::run_once) do not fit it. The MCP gateway is the
//! one such caller: it waits for another attempt whatever its lease, fails at once when the gate
//! cannot be reached (nothing is forwarded, the model hears it at once), releases a call its
//! upstream refused before running as not attempted, and keeps a note when a result is larger
//! than the gate stores.

use oncegate_proto as pb;

/// Makes the receipt Complete records when the gate refuses one as too large.
type ReplaceReceipt = fn(&[u8]) -> Vec<u8>;

/// The guard's choices beyond its bounds ([`super::GuardOptions`]). `Default` is
/// [`GateClient::run_once`](crate::GateClient::run_once)'s; each method changes one choice.
pub struct GuardHooks<E> {
    pub(super) wait_whatever_the_lease: bool,
    pub(super) retry_unavailable: bool,
    pub(super) release_reason: fn(&E) -> pb::ReleaseReason,
    pub(super) oversized_receipt: Option<ReplaceReceipt>,
}

impl<E> Default for GuardHooks<E> {
    fn default() -> Self {
        Self {
            wait_whatever_the_lease: false,
            retry_unavailable: true,
            release_reason: |_| pb::ReleaseReason::DefiniteFailure,
            oversized_receipt: None,
        }
    }
}

impl<E> std::fmt::Debug for GuardHooks<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardHooks")
            .field("wait_whatever_the_lease", &self.wait_whatever_the_lease)
            .field("retry_unavailable", &self.retry_unavailable)
            .field("oversized_receipt", &self.oversized_receipt.is_some())
            .finish_non_exhaustive()
    }
}

impl<E> GuardHooks<E> {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits for an attempt in progress elsewhere for the whole `max_wait`, polling, even when
    /// its lease outlasts it: the other attempt usually completes long before its lease ends.
    /// Without this, such a lease fails at once with
    /// [`GuardError::InProgressBeyondWait`](super::GuardError::InProgressBeyondWait).
    pub fn wait_whatever_the_lease(mut self) -> Self {
        self.wait_whatever_the_lease = true;
        self
    }

    /// Stops at once with [`GuardError::Gate`](super::GuardError::Gate) (`Unavailable`) when the
    /// gate cannot be reached, instead of asking again within `max_wait`.
    pub fn fail_at_once_when_unavailable(mut self) -> Self {
        self.retry_unavailable = false;
        self
    }

    /// Why a [`Failure::Definite`](super::Failure::Definite) is released (default
    /// `DEFINITE_FAILURE`): `NOT_ATTEMPTED` when the action never started.
    pub fn release_reason(mut self, reason: fn(&E) -> pb::ReleaseReason) -> Self {
        self.release_reason = reason;
        self
    }

    /// When the gate refuses a receipt as too large (`INVALID_REQUEST` on `receipt`), Complete
    /// once more with `replace(receipt)` (a note that the result was not kept, say) instead of
    /// stopping with [`GuardError::CompleteUnacknowledged`](super::GuardError::CompleteUnacknowledged).
    pub fn replace_oversized_receipt(mut self, replace: ReplaceReceipt) -> Self {
        self.oversized_receipt = Some(replace);
        self
    }
}
