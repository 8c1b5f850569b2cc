//! The guard: run one side-effecting action at most once, with the protocol done right.
//!
//! 1. Request a token (naming this attempt as the holder, so a lost reply is re-delivered).
//! 2. Already completed → return the stored receipt without running anything.
//! 3. Granted → run the caller's closure with the grant (token, fencing, provider key) while a
//!    heartbeat extends the lease.
//! 4. Success → Complete with the receipt, retrying until the gate acknowledges it.
//! 5. [`Failure::Definite`] → Release (the action had no effect), then return the error.
//! 6. [`Failure::Ambiguous`] (timeouts, anything unmarked) → never Release: return
//!    [`GuardError::OutcomeUnknown`], to be reconciled with the provider via the provider key.
//! 7. In progress elsewhere → wait as RetryInfo says, within [`GuardOptions::max_wait`]; a live
//!    lease that outlasts what is left of it fails at once ([`GuardError::InProgressBeyondWait`]:
//!    it may be the caller's own earlier attempt).
//! 8. Key reused → stop with that error; never retry with a new key.
//!
//! One implementation, whatever the gate: [`GateClient::run_once`] runs it over gRPC; the MCP
//! gateway runs it ([`run_once_on`]) over its in-process gate too, through [`GateCalls`], with the
//! choices the defaults do not fit in [`GuardHooks`]. Files: [`calls`] (the four calls),
//! [`hooks`] (the choices), [`run`] (the protocol).

mod calls;
mod hooks;
mod run;

use std::{future::Future, time::Duration};

use serde::de::DeserializeOwned;

pub use calls::GateCalls;
pub use hooks::GuardHooks;
pub use run::run_once_on;

use super::{ActionSpec, ClientError, GateClient, Grant, Receipt, Replay};
use oncegate_proto as pb;

/// How the closure failed.
#[derive(Debug)]
pub enum Failure<E> {
    /// The action definitely had no effect (the provider said so, or it was never attempted):
    /// the token is released and the action may be granted again.
    Definite(E),
    /// The outcome is unknown (a timeout, a crash mid-call): the token is kept and the action must
    /// be reconciled.
    Ambiguous(E),
}

/// Any error the closure does not mark is ambiguous: the safe default.
impl<E> From<E> for Failure<E> {
    fn from(e: E) -> Self {
        Self::Ambiguous(e)
    }
}

/// What the guard did.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The closure ran and its receipt was recorded.
    Executed {
        /// The receipt now stored: the closure's (or, when the gate refused it as too large and
        /// [`GuardHooks::replace_oversized_receipt`] is set, its replacement).
        receipt: Vec<u8>,
        /// The grant the closure ran under.
        grant: Grant,
    },
    /// The action had already completed: nothing ran; this is the original completion (it reads
    /// as the [`pb::Completion`] it holds) and the action.
    Replayed(Replay),
}

impl Outcome {
    /// The receipt's bytes, whether fresh or replayed.
    pub fn receipt(&self) -> &[u8] {
        match self {
            Self::Executed { receipt, .. } => receipt,
            Self::Replayed(done) => &done.receipt,
        }
    }

    /// The action, as the gate names it.
    pub fn action(&self) -> &pb::ActionRef {
        match self {
            Self::Executed { grant, .. } => &grant.action,
            Self::Replayed(done) => &done.action,
        }
    }

    /// The receipt as its writer meant it: an operator's JSON as the value, an operator's text
    /// as a string, a worker's (this closure's, or a replayed one) as its bytes.
    pub fn decoded(&self) -> Result<Receipt, ClientError> {
        match self {
            Self::Executed { receipt, .. } => Ok(Receipt::Bytes(receipt.clone())),
            Self::Replayed(done) => done.decoded(),
        }
    }

    /// The receipt as a `T`: an operator's JSON value, an operator's text as a JSON string, a
    /// worker's bytes parsed as JSON. One that is none of these, or not a `T`, is
    /// [`ClientError::ReceiptUndecodable`], naming the action and who wrote the receipt.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ClientError> {
        match self {
            Self::Executed { receipt, grant } => {
                let written = pb::Completion {
                    receipt: receipt.clone(),
                    fencing: grant.fencing,
                    source: pb::CompletionSource::Worker as i32,
                    ..Default::default()
                };
                crate::receipt::decode_json(&grant.action, &written)
            }
            Self::Replayed(done) => done.json(),
        }
    }
}

/// Why the guard stopped without a receipt.
#[derive(Debug, thiserror::Error)]
pub enum GuardError<E: std::fmt::Debug> {
    /// The gate refused before anything ran (key reused, lease expired unresolved, invalid,
    /// forbidden, still in progress after the wait bound, unavailable...).
    #[error("the gate refused: {0}")]
    Gate(ClientError),
    /// A rule holds the action for an operator's approval: nothing ran. Ask again (the same
    /// request) once an operator approved `approval.id`; it is then granted once.
    #[error("pending approval {} ({})", approval.id, approval.reason)]
    PendingApproval {
        /// The approval to wait for.
        approval: oncegate_proto::Approval,
    },
    /// The closure failed definitely; its token was released.
    #[error("the action failed definitely and its token was released: {0:?}")]
    Failed(E),
    /// The closure failed definitely but the release was not acknowledged; the lease will expire.
    #[error("the action failed definitely; releasing its token failed ({release}): {cause:?}")]
    ReleaseFailed {
        /// The closure's error.
        cause: E,
        /// Why the release failed.
        release: ClientError,
        /// The grant that is still out.
        grant: Grant,
    },
    /// The outcome is unknown: the token was NOT released. Reconcile with the provider (using
    /// `grant.provider_key`), then Complete or Release with `grant.token`.
    #[error("outcome unknown, reconcile with the provider (provider key {}): {cause:?}", grant.provider_key)]
    OutcomeUnknown {
        /// The closure's error.
        cause: E,
        /// The grant to Complete or Release once reconciled.
        grant: Grant,
    },
    /// Another attempt holds a live lease that outlasts what is left of `max_wait` (the gate's
    /// RetryInfo says so), so the guard did not wait: waiting could only end in the same refusal.
    /// The lease may be this caller's own earlier attempt (an [`GuardError::OutcomeUnknown`], a
    /// crash): reconcile it with the provider using its provider key, then Complete or Release its
    /// token. Otherwise another worker runs it: retry later, or raise `max_wait` above the lease.
    #[error(
        "another attempt holds a live lease for {retry_after:?} more, beyond what is left of \
         max_wait ({max_wait:?}), so the guard did not wait; the lease may be this caller's own \
         earlier attempt (an unknown outcome, a crash): reconcile it with the provider using its \
         provider key, then Complete or Release its token; otherwise retry later"
    )]
    InProgressBeyondWait {
        /// The time left on the live lease.
        retry_after: Duration,
        /// The guard's `max_wait`.
        max_wait: Duration,
    },
    /// The action ran and succeeded, but Complete was not acknowledged within the deadline.
    /// Retry Complete with `grant.token` and `receipt`; never run the action again.
    #[error("the action succeeded but Complete was not acknowledged: {error}")]
    CompleteUnacknowledged {
        /// The last Complete error.
        error: ClientError,
        /// The receipt to Complete with.
        receipt: Vec<u8>,
        /// The grant to Complete with.
        grant: Grant,
    },
}

/// Bounds of the guard's waiting and retrying.
#[derive(Debug, Clone)]
pub struct GuardOptions {
    /// How long to wait, in total, for an attempt in progress elsewhere (or a briefly unavailable
    /// gate) before giving up with the gate's error. A live lease that outlasts what is left of
    /// it is not waited for ([`GuardError::InProgressBeyondWait`]) unless
    /// [`GuardHooks::wait_whatever_the_lease`] says so. Zero: ask once.
    pub max_wait: Duration,
    /// How long to keep retrying an unacknowledged Complete.
    pub complete_deadline: Duration,
    /// Heartbeat period; `None` derives it from the lease (a third of it, at least 1 s).
    pub heartbeat: Option<Duration>,
    /// Longest sleep between two asks while another attempt is in progress. RetryInfo says when
    /// the other lease ends at the latest; the other attempt usually completes well before.
    pub poll_interval: Duration,
}

impl Default for GuardOptions {
    fn default() -> Self {
        Self {
            max_wait: Duration::from_secs(30),
            complete_deadline: Duration::from_secs(30),
            heartbeat: None,
            poll_interval: Duration::from_millis(500),
        }
    }
}

impl GateClient {
    /// Runs `work` at most once for `spec` (see the module docs for the protocol): [`run_once_on`]
    /// this client with the default [`GuardHooks`].
    pub async fn run_once<F, Fut, E>(
        &self,
        spec: &ActionSpec,
        options: &GuardOptions,
        work: F,
    ) -> Result<Outcome, GuardError<E>>
    where
        F: FnOnce(Grant) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, Failure<E>>>,
        E: std::fmt::Debug,
    {
        run_once_on(self, spec, options, &GuardHooks::default(), work).await
    }
}
