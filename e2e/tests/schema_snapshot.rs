//! `collector/schema.sql` is the schema the migrations produce: a newcomer reads one file, not
//! every migration, and a migration that changes the schema changes the snapshot in the same
//! commit. After adding a migration, regenerate it with
//! `RAILGUARD_BLESS=1 cargo nextest run -p railguard-e2e --test schema_snapshot`.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::path::Path;

use railguard_e2e::TestPg;
use railguard_e2e::schema::snapshot;

#[tokio::test]
async fn the_checked_in_schema_is_what_the_migrations_make() {
    let pg = TestPg::start().await;
    let now = snapshot(&pg.pool).await.unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../collector/schema.sql");
    if std::env::var("RAILGUARD_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &now).unwrap();
    }
    let stored = std::fs::read_to_string(&path).unwrap_or_default();
    if stored != now {
        let first = stored
            .lines()
            .zip(now.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(stored.lines().count().min(now.lines().count()));
        panic!(
            "collector/schema.sql disagrees with the migrations from line {} (RAILGUARD_BLESS=1 regenerates it):\n\
             snapshot: {:?}\nmigrated: {:?}",
            first + 1,
            stored.lines().nth(first),
            now.lines().nth(first)
        );
    }
    // The snapshot is the schema, not an empty shell: the tables a pass reads are in it.
    for table in ["CREATE TABLE probe_results (", "CREATE TABLE gpu_status (", "CREATE TABLE nodes ("] {
        assert!(now.contains(table), "{table} missing from the snapshot");
    }
}

#[tokio::test]
async fn a_schema_change_shows_in_the_snapshot() {
    let pg = TestPg::start().await;
    let before = snapshot(&pg.pool).await.unwrap();
    sqlx::query("ALTER TABLE nodes ADD COLUMN added_by_hand text").execute(&pg.pool).await.unwrap();
    sqlx::query("CREATE INDEX by_hand ON nodes (added_by_hand)").execute(&pg.pool).await.unwrap();
    let after = snapshot(&pg.pool).await.unwrap();
    assert_ne!(before, after);
    assert!(after.contains("    added_by_hand text"), "column missing");
    assert!(after.contains("CREATE INDEX by_hand ON public.nodes USING btree (added_by_hand);"), "index missing");
}
