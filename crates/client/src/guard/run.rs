//! The guard's protocol over any gate ([`GateCalls`]): acquire, run with a heartbeat, then
//! Complete, Release or keep the lease. The steps are the module docs' of [`super`].

use std::{
    convert::Infallible,
    future::Future,
    time::{Duration, Instant},
};

use super::{Failure, GateCalls, GuardError, GuardHooks, GuardOptions, Outcome};
use crate::{ActionSpec, ClientError, Grant, TokenReply};

/// Runs `work` at most once for `spec` on `gate`, bounded by `options`, with `hooks`' choices.
/// [`GateClient::run_once`](crate::GateClient::run_once) is this on a gRPC client with the
/// default hooks.
pub async fn run_once_on<G, F, Fut, E>(
    gate: &G,
    spec: &ActionSpec,
    options: &GuardOptions,
    hooks: &GuardHooks<E>,
    work: F,
) -> Result<Outcome, GuardError<E>>
where
    G: GateCalls,
    F: FnOnce(Grant) -> Fut,
    Fut: Future<Output = Result<Vec<u8>, Failure<E>>>,
    E: std::fmt::Debug,
{
    let mut spec = spec.clone();
    if spec.holder.is_empty() {
        // A holder makes RequestToken safe to retry: a lost grant reply is re-delivered.
        spec.holder = format!("guard-{}", uuid::Uuid::new_v4().simple());
    }
    let grant = match acquire(gate, &spec, options, hooks).await? {
        TokenReply::AlreadyCompleted(replay) => return Ok(Outcome::Replayed(replay)),
        TokenReply::PendingApproval(approval) => {
            return Err(GuardError::PendingApproval { approval });
        }
        TokenReply::Granted(grant) => grant,
    };
    let lease = spec
        .lease
        .unwrap_or(grant.lease)
        .max(Duration::from_secs(1));
    let every = options
        .heartbeat
        .unwrap_or((lease / 3).max(Duration::from_secs(1)));
    // The heartbeat runs beside the closure in this task, so it ends with it, also when the
    // caller drops the guard's future.
    let result = {
        let work = work(grant.clone());
        let beats = heartbeat(gate, &grant, lease, every);
        tokio::pin!(work, beats);
        tokio::select! {
            biased;
            result = &mut work => result,
            never = &mut beats => match never {},
        }
    };
    match result {
        Ok(receipt) => finish(gate, grant, receipt, options, hooks).await,
        Err(Failure::Definite(cause)) => {
            match gate.release(&grant, (hooks.release_reason)(&cause)).await {
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

/// RequestToken, waiting out IN_PROGRESS (and, unless the hooks say otherwise, brief
/// unavailability) within `max_wait`.
async fn acquire<G: GateCalls, E: std::fmt::Debug>(
    gate: &G,
    spec: &ActionSpec,
    options: &GuardOptions,
    hooks: &GuardHooks<E>,
) -> Result<TokenReply, GuardError<E>> {
    let deadline = Instant::now() + options.max_wait;
    let mut backoff = Duration::from_millis(50);
    loop {
        let err = match gate.request_token(spec).await {
            Ok(reply) => return Ok(reply),
            Err(err) => err,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let delay = match &err {
            ClientError::InProgress { retry_after }
                if *retry_after > left && !hooks.wait_whatever_the_lease =>
            {
                return Err(GuardError::InProgressBeyondWait {
                    retry_after: *retry_after,
                    max_wait: options.max_wait,
                });
            }
            ClientError::InProgress { retry_after } => (*retry_after).min(options.poll_interval),
            ClientError::RateLimited { retry_after } => *retry_after,
            ClientError::Unavailable(_) if hooks.retry_unavailable => {
                backoff = (backoff * 2).min(Duration::from_secs(2));
                backoff
            }
            _ => return Err(GuardError::Gate(err)),
        };
        if left.is_zero() {
            return Err(GuardError::Gate(err));
        }
        // Not `clamp`: it panics when less than its minimum is left.
        tokio::time::sleep(delay.max(Duration::from_millis(10)).min(left)).await;
    }
}

/// Complete, retrying transient failures until acknowledged or the deadline passes; a receipt
/// refused as too large is replaced once when the hooks say how.
async fn finish<G: GateCalls, E: std::fmt::Debug>(
    gate: &G,
    grant: Grant,
    mut receipt: Vec<u8>,
    options: &GuardOptions,
    hooks: &GuardHooks<E>,
) -> Result<Outcome, GuardError<E>> {
    let until = Instant::now() + options.complete_deadline;
    let mut backoff = Duration::from_millis(50);
    let mut replace = hooks.oversized_receipt;
    loop {
        match gate.complete(&grant, &receipt).await {
            Ok(_) => return Ok(Outcome::Executed { receipt, grant }),
            Err(ClientError::Invalid { field, .. }) if field == "receipt" && replace.is_some() => {
                if let Some(replace) = replace.take() {
                    receipt = replace(&receipt);
                }
            }
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

/// Extends the lease every `every` while the closure runs; never returns. After a refusal that
/// asking again cannot change (the lease already ended, say) it stops beating.
async fn heartbeat<G: GateCalls>(
    gate: &G,
    grant: &Grant,
    lease: Duration,
    every: Duration,
) -> Infallible {
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = gate.extend_lease(grant, lease).await
            && !e.is_retryable()
        {
            return std::future::pending().await;
        }
    }
}
