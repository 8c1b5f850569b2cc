//! The Store contract, and the closed set of stores behind it.
//!
//! A store persists action records and applies one state-machine step per call **atomically**:
//! the read of the record, the decision and the write happen as one indivisible step with respect
//! to every other call on the same action key, from any number of gate replicas. The decision is
//! the one [`oncegate_domain::ledger`] makes (the embedded and PostgreSQL stores run it; the Redis
//! scripts mirror it). On PostgreSQL a step is one transaction: locks (the action key's, then the
//! agent's when its side state is read), reads, the ledger in the gate, writes, COMMIT; an error
//! before COMMIT leaves nothing behind (the transaction rolls back, or the connection is closed).
//!
//! Time is the store's: every reply carries the `now` the step used, so all replicas agree on when
//! a lease ends.
//!
//! What an error leaves behind: [`StoreError::Unavailable`] means the outcome is unknown to the
//! caller (the step may or may not have been applied); nothing is ever *granted* to a caller that
//! got an error, and retrying the same call is safe because every step is idempotent for the same
//! request (a repeated grant to the same holder re-delivers, a repeated Complete returns the stored
//! completion). On PostgreSQL, `Unavailable` says which: "nothing was written" (a failure before
//! COMMIT; a serialization failure or a deadlock is retried inside the store first), or "whether it
//! was applied is unknown" (the connection was lost after COMMIT was sent, or the deadline passed
//! meanwhile). [`StoreError::Corrupt`] means a stored value of that action (or of its agent's
//! approvals, budgets or receipt chain) could not be decoded; nothing was written, and the store
//! keeps serving every other action.
//!
//! Every state change takes a durability level: the number of replicas that must confirm it before
//! it is acknowledged (Redis `WAIT`; PostgreSQL: synchronous standbys, as the server's settings
//! promise for every commit); a store that cannot meet it fails closed.
//!
//! Receipt chains: a completion call may carry a [`Receipts`] signer (the gate's). Then a
//! completion the step records is also appended to its agent's receipt chain, in the same atomic
//! step (embedded, PostgreSQL: the same transaction; Redis: the same script, under the agent's hash
//! tag). The
//! chain's order is the order the store recorded the completions in, so two completions of one
//! agent cannot fork it. Only chain *heads* are signed (each entry's digest covers the one before,
//! so a head covers them all): the embedded store signs each agent's last entry of a group commit
//! inside its transaction; PostgreSQL signs each completion's entry as the head inside that
//! completion's transaction; Redis (Lua cannot sign) seals each chain that grew once per sealing
//! interval, off the call's path, and when it is exported.
//!
//! The webhook outbox ([`outbox`]) lives in the same store: events waiting for delivery, written,
//! claimed and settled in atomic steps of their own (Redis: scripts on the `og:{outbox}` keys, one
//! Cluster slot; embedded: tables of the same file, through the same writer and group commit;
//! PostgreSQL: one table, a transaction per step).
//! Outbox steps wait for no replicas.
//!
//! Does not own: validation, fingerprints, policies (the gate decides those before calling).

pub mod codec;
pub mod embedded;
mod error;
pub mod list;
pub mod outbox;
pub mod postgres;
pub mod redis;

pub use error::{Cause, StoreError};
pub use list::{ListCursor, Page, Unresolved};
pub use outbox::{Claimed, NewEntry, OutboxEntry, OutboxPage, OutboxState, Settlement};

use std::sync::Arc;

use oncegate_domain::ActionKey;
use oncegate_domain::ledger::{
    ActionView, CompleteOutcome, ExternalCompletion, Millis, Refusal, Resolution, Resolved,
    TokenOutcome, TokenRequest,
};
use oncegate_domain::ledger::{Approval, Bucket, approval::Decision};
use oncegate_domain::statement::receipt::{ChainEntry, ReceiptSigner};

/// The signer of receipt statements a completion call carries (the gate's); `None`: completions
/// are recorded without a chain.
pub type Receipts = Arc<dyn ReceiptSigner>;

/// The result of one store call: the step's reply, the store time it was taken at, and how many
/// replicas confirmed it (Redis `WAIT`). A state change is only returned once at least the asked
/// number of replicas confirmed it; otherwise the call fails closed with
/// [`StoreError::Unavailable`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply<T> {
    /// The store's clock when the step ran (Unix milliseconds).
    pub now: Millis,
    /// The step's reply.
    pub result: Result<T, Refusal>,
    /// Replicas that confirmed the change; 0 when none was asked for or the store has none.
    pub replicas: u32,
}

/// One approval and the action it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalEntry {
    pub key: ActionKey,
    pub approval: Approval,
}

/// A page of one agent's approvals, by lapse time.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApprovalPage {
    pub items: Vec<ApprovalEntry>,
    /// Where the next page starts (`lease_expires_at` holds the lapse time); `None` at the end.
    pub next: Option<ListCursor>,
}

/// What a store promises about durability, for the start-up log and docs/deployment.md.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durability {
    /// False when the store keeps nothing across a restart (Redis with neither AOF nor RDB).
    pub persistent: bool,
    /// One line for the operator.
    pub summary: String,
}

/// The stores the gate can run on. A closed set: adding one means adding a variant and passing the
/// conformance suite.
#[derive(Clone)]
pub enum Store {
    /// The durable single-node file store (redb), the default.
    Embedded(embedded::EmbeddedStore),
    /// Redis: standalone, Cluster or Sentinel (Lua scripts, one round trip per step).
    Redis(redis::RedisStore),
    /// PostgreSQL: one transaction per step, decided by the ledger (two round trips per step).
    Postgres(postgres::PostgresStore),
}

macro_rules! dispatch {
    ($self:expr, $store:ident => $call:expr) => {
        match $self {
            Store::Embedded($store) => $call,
            Store::Redis($store) => $call,
            Store::Postgres($store) => $call,
        }
    };
}

impl Store {
    /// Which store it is, for logs and events: `embedded`, `redis` or `postgres`.
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Embedded(_) => "embedded",
            Store::Redis(_) => "redis",
            Store::Postgres(_) => "postgres",
        }
    }

    /// On Redis, this store over a connection of its own, made on the runtime this is awaited on
    /// ([`redis::RedisStore::another_connection`]); `None` for the embedded store, whose one
    /// writer every handle shares.
    pub async fn another_connection(&self) -> Result<Option<Store>, StoreError> {
        match self {
            Store::Embedded(_) | Store::Postgres(_) => Ok(None),
            Store::Redis(redis) => Ok(Some(Store::Redis(redis.another_connection().await?))),
        }
    }

    /// RequestToken: grant, re-deliver, replay or refuse (see
    /// [`oncegate_domain::ledger::request_token`]). A grant is handed out only once `replicas`
    /// replicas (or the deployment's level, if higher) confirmed it; fails closed when fewer do.
    pub async fn request_token(
        &self,
        key: &ActionKey,
        req: &TokenRequest,
        replicas: u32,
    ) -> Result<Reply<TokenOutcome>, StoreError> {
        match self {
            Store::Embedded(s) => {
                unreplicated(replicas)?;
                s.request_token(key, req).await
            }
            Store::Redis(s) => s.request_token(key, req, replicas).await,
            Store::Postgres(s) => s.request_token(key, req, replicas).await,
        }
    }

    /// Complete with a token and a receipt, waiting for replicas the same way; a recorded
    /// completion joins its agent's receipt chain when `receipts` signs.
    pub async fn complete(
        &self,
        key: &ActionKey,
        token: &str,
        receipt: &[u8],
        replicas: u32,
        receipts: Option<&Receipts>,
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        match self {
            Store::Embedded(s) => {
                unreplicated(replicas)?;
                s.complete(key, token, receipt, receipts).await
            }
            Store::Redis(s) => s.complete(key, token, receipt, replicas, receipts).await,
            Store::Postgres(s) => s.complete(key, token, receipt, replicas, receipts).await,
        }
    }

    /// Release a token (the reply is the released grant's fencing number), waiting for replicas
    /// the same way.
    pub async fn release(
        &self,
        key: &ActionKey,
        token: &str,
        replicas: u32,
    ) -> Result<Reply<u64>, StoreError> {
        match self {
            Store::Embedded(s) => {
                unreplicated(replicas)?;
                s.release(key, token).await
            }
            Store::Redis(s) => s.release(key, token, replicas).await,
            Store::Postgres(s) => s.release(key, token, replicas).await,
        }
    }

    /// Extend a live lease to `now + ttl` (the reply is the new expiry), waiting for replicas the
    /// same way.
    pub async fn extend_lease(
        &self,
        key: &ActionKey,
        token: &str,
        ttl: Millis,
        replicas: u32,
    ) -> Result<Reply<Millis>, StoreError> {
        match self {
            Store::Embedded(s) => {
                unreplicated(replicas)?;
                s.extend_lease(key, token, ttl).await
            }
            Store::Redis(s) => s.extend_lease(key, token, ttl, replicas).await,
            Store::Postgres(s) => s.extend_lease(key, token, ttl, replicas).await,
        }
    }

    /// Read an action as it stands.
    pub async fn get(&self, key: &ActionKey) -> Result<Reply<ActionView>, StoreError> {
        dispatch!(self, s => s.get(key).await)
    }

    /// An operator's completion of an action done by hand (see [`oncegate_domain::ledger::record_external`]).
    pub async fn record_external(
        &self,
        key: &ActionKey,
        ext: &ExternalCompletion,
        replicas: u32,
        receipts: Option<&Receipts>,
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        match self {
            Store::Embedded(s) => {
                unreplicated(replicas)?;
                s.record_external(key, ext, receipts).await
            }
            Store::Redis(s) => s.record_external(key, ext, replicas, receipts).await,
            Store::Postgres(s) => s.record_external(key, ext, replicas, receipts).await,
        }
    }

    /// An operator's settlement of an expired lease (see [`oncegate_domain::ledger::resolve_expired`]);
    /// with `expected`, only of the unresolved grant with that fencing number.
    pub async fn resolve_expired(
        &self,
        key: &ActionKey,
        resolution: &Resolution,
        expected: Option<u64>,
        replicas: u32,
        receipts: Option<&Receipts>,
    ) -> Result<Reply<Resolved>, StoreError> {
        match self {
            Store::Embedded(s) => {
                unreplicated(replicas)?;
                s.resolve_expired(key, resolution, expected, receipts).await
            }
            Store::Redis(s) => {
                s.resolve_expired(key, resolution, expected, replicas, receipts)
                    .await
            }
            Store::Postgres(s) => {
                s.resolve_expired(key, resolution, expected, replicas, receipts)
                    .await
            }
        }
    }

    /// Signs the head of `agent_id`'s receipt chain now if entries were appended since its last
    /// signed head (Redis, which otherwise does it once per sealing interval); the embedded store
    /// signs every group commit's heads before committing it, so it has nothing to do.
    pub async fn seal_receipts(&self, agent_id: &str, signer: &Receipts) -> Result<(), StoreError> {
        match self {
            Self::Embedded(_) | Self::Postgres(_) => Ok(()),
            Self::Redis(s) => s.seal_receipts(agent_id, signer).await,
        }
    }

    /// Up to `limit` entries of `agent_id`'s receipt chain after entry `after` (0: from the
    /// first), in chain order, as stored: the caller verifies them.
    pub async fn receipts(
        &self,
        agent_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ChainEntry>, StoreError> {
        dispatch!(self, s => s.receipts(agent_id, after, limit).await)
    }

    /// Up to `limit` unresolved actions (lease ended, neither completed nor released) after
    /// `after`, of one agent or of every agent, judged at the store's `now`. Not a snapshot: each
    /// entry is checked against its record when read, and an entry may be absent from a page
    /// when it changes meanwhile. A page may hold fewer than `limit` entries and still have a
    /// next cursor.
    pub async fn list_unresolved(
        &self,
        agent_id: Option<&str>,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<Page>, StoreError> {
        dispatch!(self, s => s.list_unresolved(agent_id, after, limit).await)
    }

    /// An operator's decision on the approval of `key` (see
    /// [`oncegate_domain::ledger::approval::decide`]); the reply says whether it changed.
    pub async fn decide_approval(
        &self,
        key: &ActionKey,
        decision: &Decision,
        replicas: u32,
    ) -> Result<Reply<(Approval, bool)>, StoreError> {
        match self {
            Store::Embedded(s) => {
                unreplicated(replicas)?;
                s.decide_approval(key, decision).await
            }
            Store::Redis(s) => s.decide_approval(key, decision, replicas).await,
            Store::Postgres(s) => s.decide_approval(key, decision, replicas).await,
        }
    }

    /// Up to `limit` live approvals of `agent_id` after `after`, by lapse time.
    pub async fn list_approvals(
        &self,
        agent_id: &str,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<ApprovalPage>, StoreError> {
        dispatch!(self, s => s.list_approvals(agent_id, after, limit).await)
    }

    /// Every budget bucket of `agent_id` as stored (the gate judges them at the reply's `now`).
    pub async fn budgets(
        &self,
        agent_id: &str,
    ) -> Result<Reply<Vec<(String, Bucket)>>, StoreError> {
        dispatch!(self, s => s.budgets(agent_id).await)
    }

    /// Outbox: writes each of `entries` as pending, due now, unless its (webhook, event id) is
    /// stored already (pending, delivered or undeliverable: then nothing changes). One atomic
    /// step; the reply is how many were written.
    pub async fn outbox_append(&self, entries: &[NewEntry]) -> Result<Reply<u32>, StoreError> {
        dispatch!(self, s => s.outbox_append(entries).await)
    }

    /// Outbox: forgets up to [`outbox::PURGE_BATCH`] settled entries past their retention, then
    /// claims up to `limit` pending entries due at the store's `now` for `claim`: each one's
    /// attempts grow by one and it is not due again until `now + lease` (so no other worker takes
    /// it meanwhile). One atomic step; the reply counts what is pending and undeliverable after it.
    pub async fn outbox_claim(
        &self,
        limit: usize,
        lease: Millis,
        claim: &str,
    ) -> Result<Reply<Claimed>, StoreError> {
        dispatch!(self, s => s.outbox_claim(limit, lease, claim).await)
    }

    /// Outbox: settles the entry (webhook, event id) claimed by `claim`: delivered or undeliverable
    /// (then kept until `now + keep`), or due again. Nothing changes when the entry is not pending
    /// under that claim (the reply is false). One atomic step.
    pub async fn outbox_settle(
        &self,
        webhook: &str,
        id: &str,
        claim: &str,
        settlement: &Settlement,
        keep: Millis,
    ) -> Result<Reply<bool>, StoreError> {
        dispatch!(self, s => s.outbox_settle(webhook, id, claim, settlement, keep).await)
    }

    /// Outbox: up to `limit` undeliverable entries after `after`, oldest given up first, with the
    /// counts of pending and undeliverable entries.
    pub async fn outbox_undeliverable(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<OutboxPage>, StoreError> {
        dispatch!(self, s => s.outbox_undeliverable(after, limit).await)
    }

    /// Checks that the store answers (health, readiness).
    pub async fn ping(&self) -> Result<(), StoreError> {
        dispatch!(self, s => s.ping().await)
    }

    /// What this store keeps across a restart.
    pub async fn durability(&self) -> Result<Durability, StoreError> {
        dispatch!(self, s => s.durability().await)
    }
}

/// The name a receipt core gives a completion's source.
pub(crate) fn source_name(source: oncegate_domain::ledger::Source) -> &'static str {
    match source {
        oncegate_domain::ledger::Source::Worker => "worker",
        oncegate_domain::ledger::Source::Operator => "operator",
    }
}

/// The embedded store has no replicas: a durability level above 0 cannot be met, so the call
/// fails closed before anything is written (start-up refuses that configuration; this is the
/// last line). A check before the step, not a future wrapped around it: a wrapper would hold the
/// step's future twice (as its argument and as what it awaits), and every call's future with it.
fn unreplicated(replicas: u32) -> Result<(), StoreError> {
    if replicas > 0 {
        return Err(StoreError::unavailable(format!(
            "durability level {replicas} needs Redis replicas; the embedded store has none"
        )));
    }
    Ok(())
}
