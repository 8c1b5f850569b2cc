-- The limit for the gate on PostgreSQL: the statements one grant-complete pair makes the server
-- run, as the PostgreSQL store sends them (crates/store/src/postgres/steps.rs), issued by pgbench
-- (`-M prepared`, one pair per pgbench transaction) with nothing in between: no gRPC, no ledger,
-- no encoding. Each step is two pipelined round trips like the store's: BEGIN, the key's advisory
-- lock and the record read with the database's clock; then the upsert and COMMIT. A new action
-- key per pair (random over 2^31 per client), a 300-byte record (about a granted record's size).
\set k random(1, 2147483647)
-- RequestToken: read nothing, write the granted record (lease end set, no expiry).
\startpipeline
BEGIN;
SELECT pg_advisory_xact_lock(1, hashtext('pgbench/run/' || :client_id || '-' || :k));
SELECT (SELECT record FROM oncegate_records WHERE key = convert_to('pgbench/run/' || :client_id || '-' || :k, 'UTF8') FOR UPDATE), (extract(epoch FROM clock_timestamp()) * 1000)::int8;
\endpipeline
\startpipeline
INSERT INTO oncegate_records (key, agent, record, lease_at, expires_at) VALUES (convert_to('pgbench/run/' || :client_id || '-' || :k, 'UTF8'), 'pgbench', decode(repeat('a5', 300), 'hex'), (extract(epoch FROM clock_timestamp()) * 1000)::int8 + 30000, NULL) ON CONFLICT (key) DO UPDATE SET record = excluded.record, lease_at = excluded.lease_at, expires_at = excluded.expires_at;
COMMIT;
\endpipeline
-- Complete: read the granted record, write the completed one (no lease, an expiry).
\startpipeline
BEGIN;
SELECT pg_advisory_xact_lock(1, hashtext('pgbench/run/' || :client_id || '-' || :k));
SELECT (SELECT record FROM oncegate_records WHERE key = convert_to('pgbench/run/' || :client_id || '-' || :k, 'UTF8') FOR UPDATE), (extract(epoch FROM clock_timestamp()) * 1000)::int8;
\endpipeline
\startpipeline
INSERT INTO oncegate_records (key, agent, record, lease_at, expires_at) VALUES (convert_to('pgbench/run/' || :client_id || '-' || :k, 'UTF8'), 'pgbench', decode(repeat('5a', 320), 'hex'), NULL, (extract(epoch FROM clock_timestamp()) * 1000)::int8 + 86400000) ON CONFLICT (key) DO UPDATE SET record = excluded.record, lease_at = excluded.lease_at, expires_at = excluded.expires_at;
COMMIT;
\endpipeline
