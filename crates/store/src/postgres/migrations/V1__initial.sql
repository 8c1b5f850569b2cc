-- The PostgreSQL store's tables (oncegate's PostgreSQL store, docs/deployment.md). Times are Unix
-- milliseconds of the database's clock; every value the ledger reads is the shared MessagePack
-- format, the other columns exist for the indexes that listings and purges read.

-- One row per action key: its record, and where it stands in the lease and expiry indexes.
CREATE TABLE oncegate_records (
    key        bytea PRIMARY KEY,          -- the encoded action key
    agent      text COLLATE "C" NOT NULL,  -- its agent id
    record     bytea NOT NULL,             -- the ledger's record
    lease_at   bigint,                     -- authorized: its lease end; released with superseded grants out: when released; otherwise null
    expires_at bigint                      -- when it is forgotten; null while its outcome is unknown
);
CREATE INDEX oncegate_records_leases ON oncegate_records (agent, lease_at, key) WHERE lease_at IS NOT NULL;
CREATE INDEX oncegate_records_expiry ON oncegate_records (expires_at) WHERE expires_at IS NOT NULL;

-- Approvals, one per action key, listed per agent by lapse time.
CREATE TABLE oncegate_approvals (
    key        bytea PRIMARY KEY,
    agent      text COLLATE "C" NOT NULL,
    expires_at bigint NOT NULL,
    approval   bytea NOT NULL
);
CREATE INDEX oncegate_approvals_agent ON oncegate_approvals (agent, expires_at, key);

-- Budget buckets, one per agent and bucket id.
CREATE TABLE oncegate_budgets (
    agent  text COLLATE "C" NOT NULL,
    bucket text COLLATE "C" NOT NULL,
    body   bytea NOT NULL,
    PRIMARY KEY (agent, bucket)
);

-- Receipt chains: one entry per recorded completion, per agent in chain order.
CREATE TABLE oncegate_receipts (
    agent text COLLATE "C" NOT NULL,
    seq   bigint NOT NULL,
    entry bytea NOT NULL,
    PRIMARY KEY (agent, seq)
);

-- The webhook outbox: one row per (webhook, event id).
CREATE TABLE oncegate_outbox (
    member     bytea PRIMARY KEY,
    state      smallint NOT NULL,          -- 1 pending, 2 delivered, 3 undeliverable
    due_at     bigint NOT NULL,
    settled_at bigint NOT NULL,
    forget_at  bigint,                     -- settled: when it is forgotten
    entry      bytea NOT NULL
);
CREATE INDEX oncegate_outbox_due ON oncegate_outbox (due_at, member) WHERE state = 1;
CREATE INDEX oncegate_outbox_dead ON oncegate_outbox (settled_at, member) WHERE state = 3;
CREATE INDEX oncegate_outbox_forget ON oncegate_outbox (forget_at) WHERE forget_at IS NOT NULL;
