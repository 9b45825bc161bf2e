//! The collector's private Postgres lets nobody in without its password: not a local process
//! running as the server's (widely shared, unprivileged) user, not root through the socket.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::os::unix::fs::PermissionsExt;

use railguard_e2e::*;
use sqlx::Connection;

#[tokio::test(flavor = "multi_thread")]
async fn the_private_cluster_needs_its_password_which_only_its_owner_can_read() {
    let pg = TestPg::start().await;
    let pw = pg.cluster.password_file();
    let mode = std::fs::metadata(&pw).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", pw.display());
    // The same socket and user, without the password: refused.
    let without: sqlx::postgres::PgConnectOptions = pg.cluster.connect_options("railguard").password("");
    let err = sqlx::PgConnection::connect_with(&without).await.unwrap_err();
    assert!(err.to_string().contains("password authentication failed"), "{err}");
    // With it: in.
    let mut conn = sqlx::PgConnection::connect_with(&pg.cluster.connect_options("railguard")).await.unwrap();
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut conn).await.unwrap();
    assert_eq!(one, 1);
}
