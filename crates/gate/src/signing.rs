//! The gate's signer: the active key that signs every grant and the heads of the receipt chains,
//! the issuer name, and the public keys it publishes (the active one and the retired ones that
//! still verify). One Ed25519 signature per grant; receipt chains get one per head (the stores
//! decide which entries are heads: docs/CONTRACT.md §4.x), which covers every entry before it.
//!
//! Where the keys come from (files, or generated into the data directory) is the configuration's.

use std::{
    panic::{self, AssertUnwindSafe},
    sync::{Arc, mpsc},
};

use tokio::sync::oneshot;

use ed25519_dalek::VerifyingKey;

use oncegate_domain::statement::{
    PublicKeys, StatementKey,
    grant::GrantClaims,
    receipt::{ReceiptClaims, ReceiptCore, ReceiptSigner},
};

/// Signs statements with one active key and publishes the keys that verify them.
#[derive(Debug)]
pub struct Signer {
    issuer: String,
    active: StatementKey,
    published: PublicKeys,
}

impl Signer {
    /// A signer with `active`, naming itself `issuer`; `retired` keys are published (and so still
    /// verify what they signed) but sign nothing.
    pub fn new(
        issuer: impl Into<String>,
        active: StatementKey,
        retired: impl IntoIterator<Item = VerifyingKey>,
    ) -> Arc<Self> {
        let published = PublicKeys::new(std::iter::once(active.public()).chain(retired));
        Arc::new(Self {
            issuer: issuer.into(),
            active,
            published,
        })
    }

    /// The issuer (`iss`) of every statement.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The key id of the active key.
    pub fn active_kid(&self) -> &str {
        self.active.kid()
    }

    /// The keys statements are verified with: the active key and the retired ones.
    pub fn public_keys(&self) -> &PublicKeys {
        &self.published
    }

    /// Signs a grant statement.
    pub fn sign_grant(&self, claims: &GrantClaims) -> String {
        claims.sign(&self.active)
    }
}

impl ReceiptSigner for Signer {
    fn sign_head(&self, core: &ReceiptCore, prev: &str, covers: Vec<String>) -> String {
        ReceiptClaims::new(&self.issuer, core.clone(), prev, covers).sign(&self.active)
    }
}

/// Grant statements signed on a thread of their own. Signed inline, each grant's Ed25519
/// signature (20–30 µs) holds the thread that runs the call, and every call queued behind it
/// there (all of them on a gate with one thread); here that thread goes on with other calls
/// (reading requests, sending the store their steps, writing replies) while the signing thread
/// uses the CPU the waits leave. Jobs queue and are signed in order; the thread stops when the
/// last clone of the gate is dropped. A gate over another handle on its store (`Gate::on_store`,
/// for `oncegate.local`'s blocking callers on Redis) signs inline: its callers wait anyway.
#[derive(Debug)]
pub(crate) struct SigningThread {
    jobs: mpsc::Sender<Job>,
}

/// A grant's claims and where its statement goes: `Err` gives the claims back when signing
/// panicked, so that the caller signs them itself (and panics as an inline signature would).
type Job = (GrantClaims, oneshot::Sender<Result<String, GrantClaims>>);

impl SigningThread {
    /// Starts the thread that signs with `signer`'s active key.
    pub(crate) fn start(signer: Arc<Signer>) -> std::io::Result<Self> {
        Self::start_signing(move |claims| signer.sign_grant(claims))
    }

    /// Starts the thread that signs each job's claims with `sign`.
    fn start_signing(
        sign: impl Fn(&GrantClaims) -> String + Send + 'static,
    ) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("oncegate-signer".into())
            .spawn(move || {
                for (claims, done) in queue {
                    let signed = panic::catch_unwind(AssertUnwindSafe(|| sign(&claims)));
                    // The caller may have gone (its call cancelled): nothing to answer.
                    let _ = done.send(signed.map_err(|_| claims));
                }
            })?;
        Ok(Self { jobs })
    }

    /// The statement for `claims`, signed on the thread; `signer` signs it here when the thread
    /// cannot (gone, or its signature panicked).
    pub(crate) async fn sign(&self, signer: &Signer, claims: GrantClaims) -> String {
        let (done, signed) = oneshot::channel();
        let claims = match self.jobs.send((claims, done)) {
            Ok(()) => match signed.await {
                Ok(Ok(statement)) => return statement,
                Ok(Err(claims)) => claims,
                // The thread dropped the job without answering: it can only have been the
                // thread's end, and the claims went with it. Sign nothing twice: this is a bug.
                Err(_) => unreachable!("the signing thread answers every job it takes"),
            },
            Err(mpsc::SendError((claims, _))) => claims,
        };
        signer.sign_grant(&claims)
    }
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::SigningKey;

    use super::*;

    fn claims(fencing: u64) -> GrantClaims {
        GrantClaims {
            iss: "gate-test".into(),
            aud: "payments.transfer".into(),
            iat: 1_700_000_000,
            exp: 1_700_000_030,
            agent: "agent-1".into(),
            run: "run-1".into(),
            action: "payments.transfer".into(),
            key: format!("key-{fencing}"),
            intent: String::new(),
            fingerprint: "v1-abc".into(),
            fencing,
            provider_key: format!("og-{fencing}"),
        }
    }

    /// Calls waiting on the thread together each get their own statement, the same bytes the
    /// signer gives inline (Ed25519 signatures are deterministic).
    #[tokio::test(flavor = "current_thread")]
    async fn the_signing_thread_gives_each_caller_its_own_inline_statement() {
        let signer = Signer::new(
            "gate-test",
            StatementKey::new(SigningKey::from_bytes(&[7; 32])),
            [],
        );
        let thread = Arc::new(SigningThread::start(signer.clone()).expect("a thread starts"));
        let mut calls = tokio::task::JoinSet::new();
        for fencing in 1..=64 {
            let (thread, signer) = (thread.clone(), signer.clone());
            calls.spawn(async move { (fencing, thread.sign(&signer, claims(fencing)).await) });
        }
        let mut answered = 0;
        while let Some(call) = calls.join_next().await {
            let (fencing, statement) = call.expect("a call ends");
            assert_eq!(
                statement,
                signer.sign_grant(&claims(fencing)),
                "fencing {fencing}"
            );
            answered += 1;
        }
        assert_eq!(answered, 64);
    }

    /// A signature that panics on the thread is signed again by the caller (and would panic
    /// there, as an inline signature does); the thread goes on signing the jobs after it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_panic_on_the_signing_thread_is_signed_inline_and_the_thread_goes_on() {
        let signer = Signer::new(
            "gate-test",
            StatementKey::new(SigningKey::from_bytes(&[7; 32])),
            [],
        );
        let on_thread = signer.clone();
        let thread = SigningThread::start_signing(move |claims| {
            assert_ne!(claims.fencing, 2, "the thread's signature broke");
            format!("thread:{}", on_thread.sign_grant(claims))
        })
        .expect("a thread starts");
        let inline = |fencing| signer.sign_grant(&claims(fencing));
        assert_eq!(
            thread.sign(&signer, claims(1)).await,
            format!("thread:{}", inline(1))
        );
        assert_eq!(thread.sign(&signer, claims(2)).await, inline(2));
        assert_eq!(
            thread.sign(&signer, claims(3)).await,
            format!("thread:{}", inline(3))
        );
    }
}
