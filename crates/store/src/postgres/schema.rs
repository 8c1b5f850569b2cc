//! The PostgreSQL store's schema: versioned SQL files under `migrations/` (`V<n>__<name>.sql`),
//! compiled into the binary and applied by refinery at start-up (and by `oncegate migrate`), in
//! order, each once, recorded in `oncegate_schema_history`. Several gates starting at once take
//! turns (a session advisory lock). A database whose schema is newer than the binary's (a newer
//! gate migrated it) is refused before anything is written: an older binary cannot know what the
//! newer schema means.

use tokio_postgres::Client;

use crate::StoreError;

refinery::embed_migrations!("src/postgres/migrations");

/// Where refinery records the applied versions.
pub const HISTORY: &str = "oncegate_schema_history";

/// The lock (`pg_advisory_lock(class, 0)`) that makes concurrent start-ups migrate one at a time.
const MIGRATION_LOCK: i32 = 3;

/// The newest schema version this binary knows.
pub fn binary_version() -> i32 {
    migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| m.version() as i32)
        .max()
        .unwrap_or(0)
}

/// The newest version applied to the database (0: none).
pub async fn database_version(client: &Client) -> Result<i32, tokio_postgres::Error> {
    let row = client
        .query_one(&format!("SELECT to_regclass('{HISTORY}') IS NOT NULL"), &[])
        .await?;
    if !row.get::<_, bool>(0) {
        return Ok(0);
    }
    let row = client
        .query_one(&format!("SELECT coalesce(max(version), 0)::int4 FROM {HISTORY}"), &[])
        .await?;
    Ok(row.get(0))
}

/// Refuses a database migrated by a newer binary, then applies the migrations it lacks; the
/// versions applied now.
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>, StoreError> {
    let db = |e: tokio_postgres::Error| StoreError::unavailable_by("PostgreSQL: migrating the schema", e);
    client
        .execute("SELECT pg_advisory_lock($1::int4, 0)", &[&MIGRATION_LOCK])
        .await
        .map_err(db)?;
    let result = async {
        let found = database_version(client).await.map_err(db)?;
        let known = binary_version();
        if found > known {
            return Err(StoreError::Misconfigured(format!(
                "PostgreSQL: schema version {found} is newer than this binary's {known}: upgrade \
                 oncegate or point it at another database"
            )));
        }
        let report = migrations::runner()
            .set_migration_table_name(HISTORY)
            .run_async(client)
            .await
            .map_err(|e| StoreError::unavailable_by("PostgreSQL: migrating the schema", e))?;
        Ok(report
            .applied_migrations()
            .iter()
            .map(|m| m.version() as i32)
            .collect())
    }
    .await;
    let _ = client
        .execute("SELECT pg_advisory_unlock($1::int4, 0)", &[&MIGRATION_LOCK])
        .await;
    result
}
