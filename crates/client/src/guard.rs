//! The guard: run one side-effecting action at most once, with the protocol done right.
//!
//! 1. Request a token (naming this attempt as the holder, so a lost reply is re-delivered).
//! 2. Already completed → return the stored receipt without running anything.
//! 3. Granted → run the caller's closure with the grant (token, fencing, provider key) while a
//!    background heartbeat extends the lease.
//! 4. Success → Complete with the receipt, retrying until the gate acknowledges it.
//! 5. [`Failure::Definite`] → Release (the action had no effect), then return the error.
//! 6. [`Failure::Ambiguous`] (timeouts, anything unmarked) → never Release: return
//!    [`GuardError::OutcomeUnknown`], to be reconciled with the provider via the provider key.
//! 7. In progress elsewhere → wait as RetryInfo says, within [`GuardOptions::max_wait`]; a live
//!    lease that outlasts what is left of it fails at once ([`GuardError::InProgressBeyondWait`]:
//!    it may be the caller's own earlier attempt).
//! 8. Key reused → stop with that error; never retry with a new key.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use serde::de::DeserializeOwned;

use super::{ActionSpec, ClientError, GateClient, Grant, Receipt, Replay, TokenReply};
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
        /// The closure's receipt, now stored.
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
    /// it is not waited for ([`GuardError::InProgressBeyondWait`]).
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
    /// Runs `work` at most once for `spec` (see the module docs for the protocol).
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
        let mut spec = spec.clone();
        if spec.holder.is_empty() {
            // A holder makes RequestToken safe to retry: a lost grant reply is re-delivered.
            spec.holder = format!("guard-{}", uuid::Uuid::new_v4().simple());
        }
        let (action, reply) = self.acquire(&spec, options).await?;
        let grant = match reply {
            TokenReply::AlreadyCompleted(completion) => {
                return Ok(Outcome::Replayed(Replay { action, completion }));
            }
            TokenReply::PendingApproval(approval) => {
                return Err(GuardError::PendingApproval { approval });
            }
            TokenReply::Granted(grant) => grant,
        };
        let heartbeat = self.start_heartbeat(&grant, &spec, options);
        let result = work(grant.clone()).await;
        heartbeat.abort();
        match result {
            Ok(receipt) => self.finish(grant, receipt, options.complete_deadline).await,
            Err(Failure::Definite(cause)) => {
                let mut client = self.clone();
                match client
                    .release(
                        &grant.action,
                        &grant.token,
                        pb::ReleaseReason::DefiniteFailure,
                    )
                    .await
                {
                    Ok(_) => Err(GuardError::Failed(cause)),
                    Err(release) => Err(GuardError::ReleaseFailed {
                        cause,
                        release,
                        grant,
                    }),
                }
            }
            Err(Failure::Ambiguous(cause)) => Err(GuardError::OutcomeUnknown { cause, grant }),
        }
    }

    /// RequestToken, waiting out IN_PROGRESS and brief unavailability within `max_wait`.
    async fn acquire<E: std::fmt::Debug>(
        &self,
        spec: &ActionSpec,
        options: &GuardOptions,
    ) -> Result<(pb::ActionRef, TokenReply), GuardError<E>> {
        let deadline = Instant::now() + options.max_wait;
        let mut client = self.clone();
        let mut backoff = Duration::from_millis(50);
        loop {
            let err = match client.request_token_for(spec).await {
                Ok(answer) => return Ok(answer),
                Err(err) => err,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let delay = match &err {
                ClientError::InProgress { retry_after } if *retry_after > left => {
                    return Err(GuardError::InProgressBeyondWait {
                        retry_after: *retry_after,
                        max_wait: options.max_wait,
                    });
                }
                ClientError::InProgress { retry_after } => {
                    (*retry_after).min(options.poll_interval)
                }
                ClientError::RateLimited { retry_after } => *retry_after,
                ClientError::Unavailable(_) => {
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    backoff
                }
                _ => return Err(GuardError::Gate(err)),
            };
            if left.is_zero() {
                return Err(GuardError::Gate(err));
            }
            tokio::time::sleep(delay.clamp(Duration::from_millis(10), left)).await;
        }
    }

    /// Complete, retrying transient failures until acknowledged or the deadline passes.
    async fn finish<E: std::fmt::Debug>(
        &self,
        grant: Grant,
        receipt: Vec<u8>,
        deadline: Duration,
    ) -> Result<Outcome, GuardError<E>> {
        let until = Instant::now() + deadline;
        let mut client = self.clone();
        let mut backoff = Duration::from_millis(50);
        loop {
            match client.complete(&grant.action, &grant.token, &receipt).await {
                Ok(_) => return Ok(Outcome::Executed { receipt, grant }),
                Err(error) if error.is_retryable() && Instant::now() < until => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(error) => {
                    return Err(GuardError::CompleteUnacknowledged {
                        error,
                        receipt,
                        grant,
                    });
                }
            }
        }
    }

    /// Extends the lease periodically while the closure runs.
    fn start_heartbeat(
        &self,
        grant: &Grant,
        spec: &ActionSpec,
        options: &GuardOptions,
    ) -> tokio::task::JoinHandle<()> {
        let lease = spec
            .lease
            .unwrap_or(grant.lease)
            .max(Duration::from_secs(1));
        let every = options
            .heartbeat
            .unwrap_or((lease / 3).max(Duration::from_secs(1)));
        let mut client = self.clone();
        let (action, token) = (grant.action.clone(), grant.token.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = client.extend_lease(&action, &token, lease).await
                    && !e.is_retryable()
                {
                    return;
                }
            }
        })
    }
}
