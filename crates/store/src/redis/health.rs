//! Whether Redis answers, and what it keeps across a restart.

use super::{RedisStore, classify};
use crate::{Durability, StoreError};

impl RedisStore {
    /// The health probe: every node answers, and none may evict keys (see [`super::eviction`]).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let probe = async {
            self.conn
                .query(&redis::cmd("PING"))
                .await
                .map_err(classify)?;
            self.recheck_eviction().await
        };
        tokio::time::timeout(self.options.call_timeout, probe)
            .await
            .map_err(|_| StoreError::unavailable("Redis did not answer PING in time"))?
    }

    /// Reads `appendonly` and `save`; a managed Redis that refuses CONFIG is reported as unknown.
    pub async fn durability(&self) -> Result<Durability, StoreError> {
        let mut get = redis::cmd("CONFIG");
        get.arg("GET")
            .arg("appendonly")
            .arg("appendfsync")
            .arg("save");
        let config: Result<Vec<String>, _> =
            tokio::time::timeout(self.options.call_timeout, self.conn.query(&get))
                .await
                .map_err(|_| ())
                .and_then(|r| r.map_err(|_| ()))
                .and_then(|v| redis::from_redis_value(v).map_err(|_| ()));
        let Ok(pairs) = config else {
            return Ok(Durability {
                persistent: false,
                summary: "could not read Redis persistence settings (CONFIG GET refused); check appendonly/save yourself".into(),
            });
        };
        let get = |name: &str| {
            pairs
                .chunks(2)
                .find(|kv| kv[0] == name)
                .and_then(|kv| kv.get(1))
                .cloned()
                .unwrap_or_default()
        };
        let (aof, fsync, save) = (get("appendonly") == "yes", get("appendfsync"), get("save"));
        let summary = match (aof, save.is_empty()) {
            (true, _) => format!("Redis AOF on (appendfsync {fsync}); RDB save '{save}'"),
            (false, false) => format!("Redis RDB snapshots only (save '{save}'): changes since the last snapshot are lost on a crash"),
            (false, true) => "Redis keeps nothing on disk (no AOF, no RDB): every record is lost when Redis restarts".into(),
        };
        Ok(Durability {
            persistent: aof || !save.is_empty(),
            summary,
        })
    }
}
