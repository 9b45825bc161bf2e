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

/// Run as root, the private cluster runs as its own system user, and a process running as
/// `nobody` (the user other services share) can neither read nor write anything of it: not the
/// data directory, not `pg_hba.conf`, not the password file, not the socket.
#[tokio::test(flavor = "multi_thread")]
async fn the_private_cluster_is_its_own_users_alone() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not root: the cluster runs as this user; nothing to check");
        return;
    }
    let pg = TestPg::start().await;
    let data = pg.cluster.data_dir().to_path_buf();
    let owner = nix::unistd::User::from_uid(std::fs::metadata(&data).unwrap().uid().into()).unwrap().unwrap();
    assert_eq!(owner.name, railguard_collector::store::pg::PG_USER);
    assert_eq!(std::fs::metadata(&data).unwrap().permissions().mode() & 0o777, 0o700);
    // The postmaster runs as that user.
    let pid: u32 =
        std::fs::read_to_string(data.join("postmaster.pid")).unwrap().lines().next().unwrap().parse().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(uid_line.split_whitespace().nth(1) == Some(&owner.uid.to_string()), "{uid_line}");

    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let as_nobody = |script: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .uid(nobody.uid.as_raw())
            .gid(nobody.gid.as_raw())
            .output()
            .unwrap()
    };
    let d = data.display();
    let pw = pg.cluster.password_file();
    for (what, script) in [
        ("list the data directory", format!("ls {d}")),
        ("read pg_hba.conf", format!("cat {d}/pg_hba.conf")),
        ("write pg_hba.conf", format!("echo 'local all all trust' >> {d}/pg_hba.conf")),
        ("read the password", format!("cat {}", pw.display())),
        ("reach the socket", format!("psql -h {d} -U railguard -d railguard -w -c 'SELECT 1'")),
        ("write into the data directory", format!("touch {d}/evil")),
    ] {
        let out = as_nobody(&script);
        assert!(!out.status.success(), "nobody could {what}: {}", String::from_utf8_lossy(&out.stdout));
    }
    // The cluster still answers its owner, with its password.
    let mut conn = sqlx::PgConnection::connect_with(&pg.cluster.connect_options("railguard")).await.unwrap();
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut conn).await.unwrap();
    assert_eq!(one, 1);
}

/// The collector's own log, at debug level, never holds a secret: not its private cluster's
/// password (the log names the file it is in), not an agent's token, not an API token a client
/// sent.
#[test]
fn the_collectors_log_holds_no_password_and_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("credentials");
    write_secret(&creds, format!("node-a {TOKEN_A}\n"));
    let api_token = dir.path().join("api-token");
    write_secret(&api_token, "api-token-0123456789abcdef");
    let log_path = dir.path().join("collector.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let (grpc, http) = free_port_pair();
    let mut child = std::process::Command::new(bin("railguard-collector"))
        .args(["serve", "--insecure", "--assess-every-secs", "1"])
        .args(["--grpc-listen", &format!("127.0.0.1:{grpc}"), "--http-listen", &format!("127.0.0.1:{http}")])
        .arg("--data-dir")
        .arg(dir.path().join("collector"))
        .arg("--credentials")
        .arg(&creds)
        .arg("--api-token-file")
        .arg(&api_token)
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "debug")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .map(KillOnDrop)
        .unwrap();
    wait_for_port(http);
    // A client with a wrong token and one with the right one; an agent's token on the wire.
    assert_eq!(http_get(http, "/api/v1/fleet", Some("a-wrong-token-987654321")).0, 401);
    assert_eq!(http_get(http, "/api/v1/fleet", Some("api-token-0123456789abcdef")).0, 200);
    let _ = std::net::TcpStream::connect(("127.0.0.1", grpc));
    // Stopped as a service manager stops it: once it has exited, all it logged is in the file.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.0.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    wait_exit(&mut child.0, std::time::Duration::from_secs(60));
    let text = std::fs::read_to_string(&log_path).unwrap();
    // The password file sits beside the cluster's data directory (`<name>.password`).
    let found = |d: &std::path::Path| {
        std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "password"))
    };
    let pw_file = found(dir.path()).or_else(|| found(&dir.path().join("collector"))).expect("no password file");
    let password = std::fs::read_to_string(pw_file).unwrap();
    let password = password.trim();
    assert!(password.len() >= 16, "the cluster's password file is {password:?}");
    assert!(text.contains("private Postgres cluster running"), "{text}");
    for secret in [password, TOKEN_A, "api-token-0123456789abcdef", "a-wrong-token-987654321"] {
        assert!(!text.contains(secret), "a secret reached the log: {secret}");
    }
}

/// The collector over verified TLS to Postgres (rustls in sqlx), as its own role would reach a
/// database on another machine: a server with a certificate from the test's own CA, listening on
/// TCP and refusing every connection that is not TLS. With `sslmode=verify-full` and that CA the
/// collector starts, stores a batch, and its connections are encrypted; given another CA it
/// refuses to start and says why; without TLS the server turns it away.
#[tokio::test(flavor = "multi_thread")]
async fn the_collector_reaches_postgres_over_verified_tls() {
    use std::os::unix::fs::MetadataExt;
    use std::process::{Command, Stdio};
    use std::time::Duration;
    let pg = TestPg::start().await;
    pg.pool.close().await;
    let data = pg.cluster.data_dir().to_path_buf();
    let owner = std::fs::metadata(&data).unwrap();
    let certs = tempfile::tempdir().unwrap();
    certs::server_and_client(certs.path());
    certs::ca(certs.path(), "other-ca");
    for (from, to) in [("server.pem", "server.crt"), ("server.key", "server.key")] {
        let dst = data.join(to);
        std::fs::copy(certs.path().join(from), &dst).unwrap();
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o600)).unwrap();
        nix::unistd::chown(&dst, Some(owner.uid().into()), Some(owner.gid().into())).unwrap();
    }
    // TCP on a port of its own (the socket moves with it); TLS only, and scram over it.
    let port = free_port();
    let mut conf = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.auto.conf")).unwrap();
    std::io::Write::write_all(
        &mut conf,
        format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
        )
        .as_bytes(),
    )
    .unwrap();
    // First match wins: these come before initdb's own lines.
    let hba = std::fs::read_to_string(data.join("pg_hba.conf")).unwrap();
    std::fs::write(
        data.join("pg_hba.conf"),
        format!("hostnossl all all 127.0.0.1/32 reject\nhostssl all all 127.0.0.1/32 scram-sha-256\n{hba}"),
    )
    .unwrap();
    pg.cluster.restart().unwrap();

    let ca = certs.path().join("ca.pem").display().to_string();
    let url = |mode: &str, root: &str| {
        format!("postgresql://railguard@127.0.0.1:{port}/railguard?sslmode={mode}&sslrootcert={root}")
    };
    let password = pg.cluster.password_file().display().to_string();
    let c =
        CollectorProc::start_with(&url("verify-full", &ca), &["tls-node"], &["--database-password-file", &password]);
    railguard_e2e::scripted::send(
        &c,
        "tls-node",
        vec![railguard_e2e::scripted::topo_rec(railguard_e2e::scripted::topology(
            &railguard_agent::topology::fixture::seed_kvm_guest(),
            None,
        ))],
    )
    .await;
    let pw = std::fs::read_to_string(&password).unwrap();
    let opts: sqlx::postgres::PgConnectOptions = url("verify-full", &ca).parse().unwrap();
    let mut conn = sqlx::PgConnection::connect_with(&opts.password(pw.trim())).await.unwrap();
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM topology_snapshots WHERE node_id = 'tls-node'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(stored, 1);
    let (all, encrypted): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.datname = 'railguard' AND a.backend_type = 'client backend'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(all >= 2 && encrypted == all, "{encrypted} of {all} connections encrypted");

    // Another CA: the collector does not start, and says it could not verify the server.
    let refused = |mode: &str, root: &str| {
        let dir = tempfile::tempdir().unwrap();
        write_secret(&dir.path().join("credentials"), format!("tls-node {}\n", token_for("tls-node")));
        let log = dir.path().join("stderr");
        // Killed if the test fails before it exits: no collector outlives the test.
        let mut child = KillOnDrop(
            Command::new(bin("railguard-collector"))
                .args(["serve", "--insecure", "--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
                .arg("--credentials")
                .arg(dir.path().join("credentials"))
                .args(["--database-password-file", &password])
                .env("DATABASE_URL", url(mode, root))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        let st = wait::until("the collector to give up", Duration::from_secs(60), || match child.0.try_wait() {
            Ok(Some(st)) => Ok(st),
            _ => Err(std::fs::read_to_string(&log).unwrap_or_default()),
        });
        let err = std::fs::read_to_string(&log).unwrap();
        assert!(!st.success(), "started: {err}");
        err
    };
    let other = certs.path().join("other-ca.pem").display().to_string();
    let err = refused("verify-full", &other);
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // No TLS: the server turns it away.
    let err = refused("disable", &ca);
    assert!(err.contains("no encryption") || err.contains("pg_hba.conf rejects"), "{err}");
}
