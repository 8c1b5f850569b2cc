//! The resolver: settles the actions whose lease ended with no outcome by asking the provider.
//!
//! A [`Resolver`] holds one lookup per action type (`payments.transfer` → "ask the bank by
//! provider key"). Its worker ([`Resolver::run`]) follows the gate's WatchUnresolved stream (what
//! is unresolved now, then each lease that ends, within seconds), asks the action's lookup, and
//! settles with ResolveExpired and the fencing number it was sent, so that two resolver replicas
//! never settle one grant twice or differently (the second hears
//! [`ClientError::AlreadySettled`] or [`ClientError::AlreadyCompleted`], and moves on). A lookup
//! that answers [`Lookup::Unknown`], fails or takes longer than the timeout leaves the action for
//! a person (it stays listed, counted and notified); it is logged. The stream is reopened with
//! backoff when it breaks, and also when a settlement failed in a way that may pass (the gate or
//! its store unavailable, a rate limit): the stream sends an action once, so only a reopened one
//! (which sends every action unresolved at that moment) brings that action back to be settled.
//!
//! The resolver's principal needs the `resolver` role (or `operator`) for the agents it settles.

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use tonic::transport::Channel;

use crate::{
    ClientError,
    credentials::{self, ApiKey},
};
use oncegate_proto::{self as pb, gate_admin_service_client::GateAdminServiceClient};

/// What the provider says about one action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// It happened: settle as completed with this receipt (what the agent's retry replays).
    Completed {
        /// The receipt's bytes.
        receipt: Vec<u8>,
        /// JSON or text (an operator receipt must say which).
        format: pb::ReceiptFormat,
    },
    /// It definitely did not happen: settle as failed (the action may be granted again).
    Failed,
    /// The provider cannot tell: leave it for a person.
    Unknown,
}

impl Lookup {
    /// Completed, with a JSON receipt.
    pub fn json(value: &serde_json::Value) -> Self {
        Self::Completed {
            receipt: value.to_string().into_bytes(),
            format: pb::ReceiptFormat::Json,
        }
    }

    /// Completed, with a text receipt.
    pub fn text(text: &str) -> Self {
        Self::Completed {
            receipt: text.as_bytes().to_vec(),
            format: pb::ReceiptFormat::Text,
        }
    }
}

/// An action whose lease ended with no outcome, as the gate sent it: what a lookup needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    /// The action, as the gate names it.
    pub action: pb::ActionRef,
    /// Its action type (`payments.transfer`); empty for records older gates wrote.
    pub action_name: String,
    /// The params its latest grant was asked with (a JSON object as text).
    pub params_json: String,
    /// The key the provider was given: look the request up by it.
    pub provider_key: String,
    /// The unsettled grant's fencing number (the settlement is conditional on it).
    pub fencing: u64,
    /// The unsettled grant's token.
    pub token: String,
    /// When its lease ended (store clock).
    pub lease_expired_at: Option<SystemTime>,
    /// The holder named at grant time, if any.
    pub holder: String,
}

impl Unresolved {
    /// Reads the gate's entry.
    pub fn from_proto(u: pb::UnresolvedAction) -> Self {
        Self {
            action: u.action.unwrap_or_default(),
            action_name: u.action_name,
            params_json: u.params_json,
            provider_key: u.provider_key,
            fencing: u.fencing,
            token: u.token,
            lease_expired_at: u
                .lease_expired_at
                .and_then(|at| SystemTime::try_from(at).ok()),
            holder: u.holder,
        }
    }

    /// The params, parsed (an empty object when none were kept).
    pub fn params(&self) -> serde_json::Value {
        serde_json::from_str(&self.params_json)
            .unwrap_or_else(|_| serde_json::Value::Object(Default::default()))
    }
}

/// What became of one unresolved action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Settled as completed with the lookup's receipt.
    Completed,
    /// Settled as failed.
    Failed,
    /// Another resolver or an operator settled it first (or a newer grant replaced it).
    ByOther,
    /// Left for a person: the reason (no lookup for the action, the provider cannot tell, the
    /// lookup failed or timed out, the settlement failed).
    Left(String),
}

/// The error a lookup may return: anything, logged and left for a person.
pub type LookupError = Box<dyn std::error::Error + Send + Sync>;

type LookupFuture = Pin<Box<dyn Future<Output = Result<Lookup, LookupError>> + Send>>;
type LookupFn = Arc<dyn Fn(Unresolved) -> LookupFuture + Send + Sync>;
/// One grant being settled here: agent, run, key, fencing.
type GrantId = (String, String, String, u64);

/// Settles unresolved actions by asking the provider, one lookup per action type.
#[derive(Clone)]
pub struct Resolver {
    admin: GateAdminServiceClient<Channel>,
    api_key: Option<ApiKey>,
    lookups: HashMap<String, LookupFn>,
    agent_id: String,
    timeout: Duration,
    backoff: (Duration, Duration),
    note: String,
    busy: Arc<Mutex<HashSet<GrantId>>>,
    /// Set when a settlement failed in a way that may pass: the stream is reopened to get the
    /// action again.
    reopen: Arc<tokio::sync::Notify>,
}

impl Resolver {
    /// A resolver over `channel`, with no lookup yet, watching every agent its principal acts for.
    pub fn new(channel: Channel) -> Self {
        Self {
            admin: GateAdminServiceClient::new(channel),
            api_key: None,
            lookups: HashMap::new(),
            agent_id: String::new(),
            timeout: Duration::from_secs(10),
            backoff: (Duration::from_millis(200), Duration::from_secs(30)),
            note: "resolver: provider lookup by provider key".into(),
            busy: Arc::default(),
            reopen: Arc::default(),
        }
    }

    /// Sends `authorization: Bearer <key>` (a resolver principal's key) with every call.
    pub fn with_api_key(mut self, key: &str) -> Result<Self, ClientError> {
        self.api_key = Some(ApiKey::new(key)?);
        Ok(self)
    }

    /// Registers the lookup of `action_name`: asked for each of its unresolved actions.
    pub fn lookup<F, Fut>(mut self, action_name: &str, lookup: F) -> Self
    where
        F: Fn(Unresolved) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Lookup, LookupError>> + Send + 'static,
    {
        let f: LookupFn = Arc::new(move |u| Box::pin(lookup(u)));
        self.lookups.insert(action_name.to_owned(), f);
        self
    }

    /// Watches only `agent_id` (default: every agent the principal acts for).
    pub fn agent(mut self, agent_id: &str) -> Self {
        self.agent_id = agent_id.to_owned();
        self
    }

    /// How long a lookup may take before the action is left for a person (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The first and the longest wait before reopening a broken stream (default 200 ms, 30 s).
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = (first, max.max(first));
        self
    }

    /// The note kept with every settlement (default names the resolver).
    pub fn note(mut self, note: &str) -> Self {
        self.note = note.to_owned();
        self
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        credentials::request(self.api_key.as_ref(), message)
    }

    /// Asks the action's lookup (within the timeout) and settles what it answers; never panics
    /// on a lookup's failure. An action already being settled by this resolver is skipped.
    pub async fn settle(&self, u: Unresolved) -> Settled {
        let scope = u.action.scope.clone().unwrap_or_default();
        let busy = (
            scope.agent_id,
            scope.run_id,
            u.action.key.clone(),
            u.fencing,
        );
        if !self.lock().insert(busy.clone()) {
            return Settled::Left("already being settled here".into());
        }
        let (settled, passing) = self.settle_once(&u).await;
        self.lock().remove(&busy);
        if passing {
            // The stream will not send this action again by itself: reopen it (after the
            // backoff), and the gate sends it again with everything still unresolved.
            self.reopen.notify_one();
        }
        match &settled {
            Settled::Left(why) => tracing::warn!(
                agent_id = %busy.0, run_id = %busy.1, key = %busy.2, fencing = u.fencing,
                action = %u.action_name, why = %why, "left for a person"
            ),
            done => tracing::info!(
                agent_id = %busy.0, run_id = %busy.1, key = %busy.2, fencing = u.fencing,
                action = %u.action_name, settled = ?done, "resolved"
            ),
        }
        settled
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<GrantId>> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What became of `u`, and whether the settlement failed in a way that may pass (then the
    /// stream is reopened to settle it again).
    async fn settle_once(&self, u: &Unresolved) -> (Settled, bool) {
        let left = |why: String| (Settled::Left(why), false);
        let Some(lookup) = self.lookups.get(&u.action_name) else {
            return left(format!("no lookup for action {:?}", u.action_name));
        };
        let answer = match tokio::time::timeout(self.timeout, lookup(u.clone())).await {
            Err(_) => return left(format!("the lookup took over {:?}", self.timeout)),
            Ok(Err(e)) => return left(format!("the lookup failed: {e}")),
            Ok(Ok(answer)) => answer,
        };
        let (resolution, receipt, format, done) = match answer {
            Lookup::Unknown => return left("the provider cannot tell".into()),
            Lookup::Failed => (
                pb::Resolution::Failed,
                Vec::new(),
                pb::ReceiptFormat::Unspecified,
                Settled::Failed,
            ),
            Lookup::Completed { receipt, format } => (
                pb::Resolution::Completed,
                receipt,
                format,
                Settled::Completed,
            ),
        };
        let request = self.request(pb::ResolveExpiredRequest {
            action: Some(u.action.clone()),
            resolution: resolution as i32,
            receipt,
            note: self.note.clone(),
            receipt_format: format as i32,
            expected_fencing: u.fencing,
        });
        match self.admin.clone().resolve_expired(request).await {
            Ok(_) => (done, false),
            Err(status) => match ClientError::from_status(&status) {
                ClientError::AlreadySettled { .. } | ClientError::AlreadyCompleted => {
                    (Settled::ByOther, false)
                }
                e => {
                    let passing = e.is_retryable();
                    let why = match passing {
                        true => {
                            format!("the settlement failed: {e}; reopening the stream to try again")
                        }
                        false => format!("the settlement failed: {e}"),
                    };
                    (Settled::Left(why), passing)
                }
            },
        }
    }

    /// Follows the gate's unresolved actions and settles each, until `shutdown` completes; a
    /// broken stream is reopened after a backoff that doubles up to its maximum (and starts
    /// again once a stream delivers), and so is one whose settlement failed in a way that may
    /// pass ([`ClientError::is_retryable`]: the gate or its store unavailable, a rate limit), so
    /// that the gate sends that action again. Each action is settled on its own task, so a slow
    /// lookup does not hold up the others.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::select! {
            () = self.follow() => {}
            () = shutdown => {}
        }
    }

    async fn follow(&self) {
        let mut wait = self.backoff.0;
        loop {
            match self.stream().await {
                Ok(mut stream) => loop {
                    let message = tokio::select! {
                        message = stream.message() => message,
                        () = self.reopen.notified() => {
                            tracing::info!("a settlement failed and may pass: reopening the \
                                unresolved stream, which sends that action again");
                            break;
                        }
                    };
                    match message {
                        Ok(Some(message)) => {
                            wait = self.backoff.0;
                            let Some(action) = message.action else {
                                continue;
                            };
                            let this = self.clone();
                            tokio::spawn(async move {
                                this.settle(Unresolved::from_proto(action)).await;
                            });
                        }
                        Ok(None) => {
                            tracing::info!("the gate ended the unresolved stream; reopening");
                            break;
                        }
                        Err(status) => {
                            tracing::warn!(error = %ClientError::from_status(&status),
                                "the unresolved stream broke; reopening");
                            break;
                        }
                    }
                },
                Err(e) => tracing::warn!(error = %e, "cannot watch the unresolved actions"),
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(self.backoff.1);
        }
    }

    async fn stream(&self) -> Result<tonic::Streaming<pb::WatchUnresolvedResponse>, ClientError> {
        let request = self.request(pb::WatchUnresolvedRequest {
            agent_id: self.agent_id.clone(),
        });
        Ok(self
            .admin
            .clone()
            .watch_unresolved(request)
            .await?
            .into_inner())
    }
}
