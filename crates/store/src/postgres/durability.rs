//! What a PostgreSQL commit promises, read from the server at start-up: `synchronous_commit`,
//! `synchronous_standby_names` (how many synchronous standbys confirm each commit), `fsync`, and
//! how many synchronous standbys `pg_stat_replication` shows connected now. A durability level is
//! a number of synchronous standbys here (on Redis, replicas that confirm a `WAIT`): a level the
//! server does not promise is refused at start-up, and a call asking for more fails closed before
//! it writes anything.

use tokio_postgres::Client;

use crate::{Durability, StoreError};

/// What every commit of this server promises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promise {
    /// Synchronous standbys that confirm each commit before it is acknowledged.
    pub replicas: u32,
    /// `fsync` on and `synchronous_commit` not `off`: an acknowledged commit survives a crash.
    pub persistent: bool,
    pub synchronous_commit: String,
    pub synchronous_standby_names: String,
    /// Synchronous standbys connected when it was read.
    pub connected: u32,
}

impl Promise {
    /// Reads the settings.
    pub async fn read(client: &Client) -> Result<Self, tokio_postgres::Error> {
        let row = client
            .query_one(
                "SELECT current_setting('synchronous_commit'), \
                 current_setting('synchronous_standby_names'), current_setting('fsync'), \
                 (SELECT count(*) FROM pg_stat_replication \
                  WHERE sync_state IN ('sync', 'quorum'))::int4",
                &[],
            )
            .await?;
        let synchronous_commit: String = row.get(0);
        let names: String = row.get(1);
        let fsync: String = row.get(2);
        let connected: i32 = row.get(3);
        let waits = matches!(
            synchronous_commit.as_str(),
            "on" | "remote_apply" | "remote_write"
        );
        Ok(Self {
            replicas: if waits { standbys_named(&names) } else { 0 },
            persistent: fsync == "on" && synchronous_commit != "off",
            synchronous_commit,
            synchronous_standby_names: names,
            connected: connected.max(0) as u32,
        })
    }

    /// Fails closed when a call asks for more synchronous standbys than a commit waits for.
    pub fn check(&self, replicas: u32) -> Result<(), StoreError> {
        if replicas > self.replicas {
            return Err(StoreError::unavailable(format!(
                "durability level {replicas} needs {replicas} synchronous standby(s) per commit; \
                 PostgreSQL waits for {} (nothing was written)",
                self.replicas
            )));
        }
        Ok(())
    }

    /// Refuses a deployment level the server does not promise, naming the setting to change.
    pub fn require(&self, level: u32) -> Result<(), StoreError> {
        if level <= self.replicas {
            return Ok(());
        }
        let fix = if self.synchronous_commit == "off" || self.synchronous_commit == "local" {
            format!(
                "synchronous_commit is {:?}, so no commit waits for a standby: set \
                 synchronous_commit = on (and synchronous_standby_names)",
                self.synchronous_commit
            )
        } else {
            format!(
                "synchronous_standby_names is {:?}, so a commit waits for {} standby(s): set it \
                 to name at least {level} (e.g. 'ANY {level} (standby1, standby2)')",
                self.synchronous_standby_names, self.replicas
            )
        };
        Err(StoreError::Misconfigured(format!(
            "--durability-replicas {level} on PostgreSQL needs {level} synchronous standby(s) per \
             commit; {fix}, or lower --durability-replicas"
        )))
    }

    /// The start-up line.
    pub fn durability(&self) -> Durability {
        let what = match (self.persistent, self.replicas) {
            (false, _) => format!(
                "PostgreSQL with synchronous_commit = {} / fsync off: a crash can lose the last \
                 acknowledged commits",
                self.synchronous_commit
            ),
            (true, 0) => format!(
                "PostgreSQL: each acknowledged change is flushed to the primary's WAL \
                 (synchronous_commit = {}); no synchronous standby, so a failover to an \
                 asynchronous standby can lose the last ones",
                self.synchronous_commit
            ),
            (true, n) => format!(
                "PostgreSQL: each acknowledged change is confirmed by {n} synchronous standby(s) \
                 (synchronous_commit = {}, synchronous_standby_names = {:?}; {} connected now), \
                 so a failover to one of them loses none",
                self.synchronous_commit, self.synchronous_standby_names, self.connected
            ),
        };
        Durability {
            persistent: self.persistent,
            summary: what,
        }
    }
}

/// How many standbys `synchronous_standby_names` makes each commit wait for: `FIRST n (...)`,
/// `ANY n (...)` and `n (...)` name n; a plain list (or `*`) names 1; empty names none.
pub fn standbys_named(names: &str) -> u32 {
    let names = names.trim();
    if names.is_empty() {
        return 0;
    }
    let mut words = names.split_whitespace();
    let first = words.next().unwrap_or_default();
    let count = if first.eq_ignore_ascii_case("first") || first.eq_ignore_ascii_case("any") {
        words.next().unwrap_or_default()
    } else {
        first
    };
    let count = count.split('(').next().unwrap_or_default();
    match count.parse::<u32>() {
        Ok(n) if names.contains('(') => n,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::standbys_named;

    #[test]
    fn standby_names_count_what_a_commit_waits_for() {
        assert_eq!(standbys_named(""), 0);
        assert_eq!(standbys_named("s1"), 1);
        assert_eq!(standbys_named("s1, s2"), 1);
        assert_eq!(standbys_named("*"), 1);
        assert_eq!(standbys_named("FIRST 2 (s1, s2, s3)"), 2);
        assert_eq!(standbys_named("ANY 1 (s1, s2)"), 1);
        assert_eq!(standbys_named("2 (s1, s2)"), 2);
        assert_eq!(standbys_named("2(s1,s2)"), 2);
    }
}
