//! Stores of every kind, fresh and empty per test, and the one way to run a test on several of
//! them ([`on_stores!`](crate::support::on_stores), documented in [`crate::support`]).

use std::time::Duration;

use oncegate_config::defaults;
use oncegate_store::{
    Store,
    embedded::{Clock, EmbeddedStore, system_clock},
    postgres::{PostgresOptions, PostgresStore},
    redis::{RedisOptions, RedisStore, Topology},
};
use tempfile::TempDir;

use super::{
    clock::{StoreTime, TestClock},
    postgres::{self, PgServer},
    redis::RedisServer,
    topology,
};

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Embedded,
    /// Standalone Redis.
    Redis,
    /// A Redis Cluster of three masters.
    Cluster,
    /// A Sentinel-managed master with one replica and three sentinels.
    Sentinel,
    /// A PostgreSQL database of the test's own (on the test process's shared server).
    Postgres,
}

/// A store and whatever keeps it alive.
pub struct Backend {
    pub store: Store,
    pub redis: Option<RedisServer>,
    pub cluster: Option<topology::RedisCluster>,
    pub sentinel: Option<topology::SentinelSet>,
    /// The PostgreSQL database's URL.
    pub postgres: Option<String>,
    /// A PostgreSQL server of the test's own (None: the shared one).
    pub pg_server: Option<PgServer>,
    /// Keeps the embedded store's directory alive.
    pub _dir: Option<TempDir>,
}

impl Backend {
    /// The `oncegate serve` flags that reach this backend's Redis.
    pub fn gate_args(&self) -> Vec<String> {
        if let Some(url) = &self.postgres {
            vec!["--postgres-url".into(), url.clone()]
        } else if let Some(redis) = &self.redis {
            vec!["--redis-url".into(), redis.url()]
        } else if let Some(cluster) = &self.cluster {
            vec!["--redis-cluster-nodes".into(), cluster.addrs().join(",")]
        } else if let Some(sentinel) = &self.sentinel {
            vec![
                "--redis-sentinels".into(),
                sentinel.addrs().join(","),
                "--redis-sentinel-master".into(),
                topology::MASTER_NAME.into(),
                "--redis-sentinel-check-ms".into(),
                "200".into(),
            ]
        } else {
            panic!("the embedded store has no address")
        }
    }

    /// Every data node of a Redis backend, by port (none for the embedded store).
    pub fn data_ports(&self) -> Vec<u16> {
        if let Some(redis) = &self.redis {
            vec![redis.port]
        } else if let Some(cluster) = &self.cluster {
            cluster.nodes.iter().map(|n| n.port).collect()
        } else if let Some(sentinel) = &self.sentinel {
            sentinel.servers.iter().map(|s| s.port).collect()
        } else {
            Vec::new()
        }
    }
}

/// Redis options for tests: fast Sentinel checks, otherwise the defaults.
pub fn test_options() -> RedisOptions {
    RedisOptions {
        sentinel_check_interval: Duration::from_millis(200),
        seal_interval: Duration::from_millis(50),
        ..defaults::redis()
    }
}

/// The store call deadline of the tests' stores (the default).
pub const STORE_TIMEOUT: Duration = Duration::from_millis(defaults::STORE_TIMEOUT_MS);

/// A fresh, empty store of `kind`.
pub async fn backend(kind: Kind) -> Backend {
    backend_with(kind, test_options()).await
}

/// A fresh, empty store of `kind` whose time the test moves where it can: the embedded store on a
/// [`TestClock`], Redis on its own clock (see [`StoreTime`]).
pub async fn backend_with_test_clock(kind: Kind) -> (Backend, StoreTime) {
    match kind {
        Kind::Embedded => {
            let clock = TestClock::new();
            (embedded(clock.clock()), StoreTime::Test(clock))
        }
        _ => (backend(kind).await, StoreTime::System),
    }
}

/// A fresh embedded store deciding with `clock`.
fn embedded(clock: Clock) -> Backend {
    let dir = TempDir::new().unwrap();
    let store = EmbeddedStore::open(dir.path(), clock, STORE_TIMEOUT).unwrap();
    Backend {
        store: Store::Embedded(store),
        redis: None,
        cluster: None,
        sentinel: None,
        postgres: None,
        pg_server: None,
        _dir: Some(dir),
    }
}

/// A fresh, empty store of `kind` with these Redis options.
pub async fn backend_with(kind: Kind, options: RedisOptions) -> Backend {
    let (mut redis, mut cluster, mut sentinel) = (None, None, None);
    let topology = match kind {
        Kind::Embedded => return embedded(system_clock()),
        Kind::Postgres => {
            let url = tokio::task::spawn_blocking(postgres::fresh_database)
                .await
                .unwrap();
            return postgres_backend(url, None).await;
        }
        Kind::Redis => {
            let server = RedisServer::start();
            let url = server.url();
            redis = Some(server);
            Topology::Standalone { url }
        }
        Kind::Cluster => {
            let started = tokio::task::spawn_blocking(|| topology::RedisCluster::start(3, 0))
                .await
                .unwrap();
            let nodes = started.addrs();
            cluster = Some(started);
            Topology::Cluster { nodes }
        }
        Kind::Sentinel => {
            let started = tokio::task::spawn_blocking(|| topology::SentinelSet::start(1, false))
                .await
                .unwrap();
            let sentinels = started.addrs();
            sentinel = Some(started);
            Topology::Sentinel {
                sentinels,
                master: topology::MASTER_NAME.into(),
            }
        }
    };
    let store = RedisStore::connect_to(&topology, options).await.unwrap();
    Backend {
        store: Store::Redis(store),
        redis,
        cluster,
        sentinel,
        postgres: None,
        pg_server: None,
        _dir: None,
    }
}

/// A store on a standalone Redis the test started (and configured) itself.
pub async fn backend_with_server(server: RedisServer) -> Backend {
    let topology = Topology::Standalone { url: server.url() };
    let store = RedisStore::connect_to(&topology, test_options())
        .await
        .unwrap();
    Backend {
        store: Store::Redis(store),
        redis: Some(server),
        cluster: None,
        sentinel: None,
        postgres: None,
        pg_server: None,
        _dir: None,
    }
}

/// Options of the tests' PostgreSQL stores: the default pool, no purge task (tests that purge
/// call it).
pub fn postgres_options() -> PostgresOptions {
    PostgresOptions {
        pool_size: defaults::POSTGRES_POOL_SIZE as usize,
        call_timeout: STORE_TIMEOUT,
        durability_replicas: 0,
        purge_interval: None,
    }
}

/// A store on the PostgreSQL database at `url` (on `server`, when the test started its own).
pub async fn postgres_backend(url: String, server: Option<PgServer>) -> Backend {
    let store = PostgresStore::connect(&url, postgres_options())
        .await
        .unwrap();
    Backend {
        store: Store::Postgres(store),
        redis: None,
        cluster: None,
        sentinel: None,
        postgres: Some(url),
        pg_server: server,
        _dir: None,
    }
}

/// Generates one test per named store for `async fn $test(kind: Kind)`: a module `$test` holding
/// `#[tokio::test] async fn <store>()` for each store (`embedded`, `redis`, `cluster`,
/// `sentinel`, `postgres`). An attribute first replaces `#[tokio::test]` (another runtime flavor).
macro_rules! on_stores {
    (#[$runtime:meta] $test:ident: $($store:ident),+ $(,)?) => {
        mod $test {
            $(
                #[$runtime]
                async fn $store() {
                    super::$test($crate::support::store_kind!($store)).await;
                }
            )+
        }
    };
    ($test:ident: $($store:ident),+ $(,)?) => {
        $crate::support::on_stores!(#[tokio::test] $test: $($store),+);
    };
}
pub(crate) use on_stores;

/// The [`Kind`] an [`on_stores!`] store name stands for; any other name does not compile.
macro_rules! store_kind {
    (embedded) => {
        $crate::support::Kind::Embedded
    };
    (redis) => {
        $crate::support::Kind::Redis
    };
    (cluster) => {
        $crate::support::Kind::Cluster
    };
    (sentinel) => {
        $crate::support::Kind::Sentinel
    };
    (postgres) => {
        $crate::support::Kind::Postgres
    };
}
pub(crate) use store_kind;
