//! The agent link over TLS (rustls through tonic), with certificates made here by openssl: the
//! agent ships to an https:// collector it verifies with its CA; a wrong CA, or plaintext to a
//! TLS listener, stores nothing (fails closed); mutual TLS refuses an agent without a client
//! certificate, or with another node's, accepts one naming its node, and follows a rotated
//! client CA without a restart; an agent picks up its renewed client certificate without one.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use railguard_e2e::certs::{ca, leaf};
use railguard_e2e::*;

/// Ships `n` spooled records with `extra` agent arguments; waits `within` at most. Returns
/// whether the agent drained its spool (exited 0).
fn ship(url: &str, dir: &Path, n: u64, extra: &[&str], within: Duration) -> bool {
    let (spool, token) = filled_spool(dir, n);
    let extra: Vec<&std::ffi::OsStr> = extra.iter().map(|s| s.as_ref()).collect();
    let mut agent = KillOnDrop(agent_ship_with(url, &spool, &token, 100, &extra));
    wait_exit(&mut agent.0, within).success()
}

/// An agent with `n` spooled records and `extra` arguments is refused: it fails twice and
/// retries (or stops at start), and drains nothing. Returns its log.
fn refused(url: &str, dir: &Path, n: u64, extra: &[&str]) -> String {
    let (spool, token) = filled_spool(dir, n);
    let extra: Vec<&std::ffi::OsStr> = extra.iter().map(|s| s.as_ref()).collect();
    LoggedAgent::start(url, &spool, &token, 100, &extra).wait_refused(2)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_link_is_tls_verified_against_its_ca_and_fails_closed() {
    let certs = tempfile::tempdir().unwrap();
    let c = certs.path();
    ca(c, "ca");
    ca(c, "other-ca");
    leaf(c, "ca", "server", "localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
    leaf(c, "ca", "client", "node-a", "subjectAltName=DNS:node-a\nextendedKeyUsage=clientAuth\n");
    // A valid client certificate of another node.
    leaf(c, "ca", "client-b", "node-b", "subjectAltName=DNS:node-b\nextendedKeyUsage=clientAuth\n");
    let p = |f: &str| c.join(f).display().to_string();

    // The mutual-TLS collector below serves the original certificate.
    std::fs::copy(c.join("server.pem"), c.join("orig.pem")).unwrap();
    std::fs::copy(c.join("server.key"), c.join("orig.key")).unwrap();
    let pg = TestPg::start().await;
    let collector =
        CollectorProc::start_with(&pg.url(), &[], &["--tls-cert", &p("server.pem"), "--tls-key", &p("server.key")]);
    let https = format!("https://127.0.0.1:{}", collector.port);

    // A CA the collector's certificate does not chain to: nothing is sent.
    let d = tempfile::tempdir().unwrap();
    refused(&https, d.path(), 50, &["--ca-file", &p("other-ca.pem")]);
    // Plaintext to the TLS listener: nothing either.
    let d = tempfile::tempdir().unwrap();
    refused(&collector.url(), d.path(), 50, &[]);
    assert_eq!(pg.stored_and_distinct().await, (0, 0), "a failed handshake stored something");
    // https:// without a CA is a clear start-up error, not a silent fallback.
    let d = tempfile::tempdir().unwrap();
    refused(&https, d.path(), 1, &[]);

    // The right CA: everything arrives.
    let d = tempfile::tempdir().unwrap();
    assert!(ship(&https, d.path(), 200, &["--ca-file", &p("ca.pem")], Duration::from_secs(60)));
    assert_eq!(pg.stored_and_distinct().await, (200, 200));

    // A renewed certificate (here from another CA, to tell them apart) takes effect at the next
    // handshake, without a restart: agents trusting only the old CA now fail, the new CA works.
    leaf(
        c,
        "other-ca",
        "renewed",
        "localhost",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    );
    std::fs::copy(c.join("renewed.key"), c.join("server.key")).unwrap();
    std::fs::copy(c.join("renewed.pem"), c.join("server.pem")).unwrap();
    let d = tempfile::tempdir().unwrap();
    refused(&https, d.path(), 10, &["--ca-file", &p("ca.pem")]);
    let d = tempfile::tempdir().unwrap();
    assert!(ship(&https, d.path(), 30, &["--ca-file", &p("other-ca.pem")], Duration::from_secs(60)));
    assert_eq!(pg.stored_and_distinct().await, (230, 230));
    // A broken renewal (garbage in the files) keeps the last good certificate.
    std::fs::write(c.join("server.pem"), "not a certificate").unwrap();
    let d = tempfile::tempdir().unwrap();
    assert!(ship(&https, d.path(), 5, &["--ca-file", &p("other-ca.pem")], Duration::from_secs(60)));
    assert_eq!(pg.stored_and_distinct().await, (235, 235));
    drop(collector);

    // Mutual TLS: a client certificate from the CA is required as well as the token.
    std::fs::copy(c.join("ca.pem"), c.join("client-ca.pem")).unwrap();
    let pg = TestPg::start().await;
    let collector = CollectorProc::start_with(
        &pg.url(),
        &[],
        &["--tls-cert", &p("orig.pem"), "--tls-key", &p("orig.key"), "--tls-client-ca", &p("client-ca.pem")],
    );
    let https = format!("https://127.0.0.1:{}", collector.port);
    let d = tempfile::tempdir().unwrap();
    refused(&https, d.path(), 50, &["--ca-file", &p("ca.pem")]);
    assert_eq!(pg.stored_and_distinct().await, (0, 0), "no client certificate, nothing stored");
    let d = tempfile::tempdir().unwrap();
    let with_cert = ["--ca-file", &p("ca.pem"), "--tls-cert", &p("client.pem"), "--tls-key", &p("client.key")];
    assert!(ship(&https, d.path(), 100, &with_cert, Duration::from_secs(60)));
    assert_eq!(pg.stored_and_distinct().await, (100, 100));

    // The certificate is a second identity: node-b's certificate with node-a's token is refused
    // (a node writes only as itself, whichever credential is stolen).
    let d = tempfile::tempdir().unwrap();
    let b_cert = ["--ca-file", &p("ca.pem"), "--tls-cert", &p("client-b.pem"), "--tls-key", &p("client-b.key")];
    refused(&https, d.path(), 20, &b_cert);
    assert_eq!(pg.stored_and_distinct().await, (100, 100), "a certificate of another node stored something");

    // The client CA rotated under the running collector: the old CA's client certificates are
    // refused from the next handshake, the new CA's accepted.
    leaf(c, "other-ca", "client-new", "node-a", "subjectAltName=DNS:node-a\nextendedKeyUsage=clientAuth\n");
    std::fs::copy(c.join("other-ca.pem"), c.join("client-ca.pem")).unwrap();
    let d = tempfile::tempdir().unwrap();
    refused(&https, d.path(), 20, &with_cert);
    let d = tempfile::tempdir().unwrap();
    let new_cert = ["--ca-file", &p("ca.pem"), "--tls-cert", &p("client-new.pem"), "--tls-key", &p("client-new.key")];
    assert!(ship(&https, d.path(), 40, &new_cert, Duration::from_secs(60)));
    assert_eq!(pg.stored_and_distinct().await, (140, 140));

    // The agent's own certificate renewed under it: started with the old CA's certificate (the
    // collector now refuses it), it picks up the renewed files without a restart and ships.
    std::fs::copy(c.join("client.pem"), c.join("agent.pem")).unwrap();
    std::fs::copy(c.join("client.key"), c.join("agent.key")).unwrap();
    let d = tempfile::tempdir().unwrap();
    let (spool, token) = filled_spool(d.path(), 30);
    let args = ["--ca-file", &p("ca.pem"), "--tls-cert", &p("agent.pem"), "--tls-key", &p("agent.key")];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|s| s.as_ref()).collect();
    let mut agent = LoggedAgent::start(&https, &spool, &token, 100, &args);
    agent.wait_refused(2);
    assert!(agent.child.0.try_wait().unwrap().is_none(), "refused, the agent keeps trying: {}", agent.log());
    assert_eq!(pg.stored_and_distinct().await, (140, 140));
    std::fs::copy(c.join("client-new.key"), c.join("agent.key")).unwrap();
    std::fs::copy(c.join("client-new.pem"), c.join("agent.pem")).unwrap();
    assert!(wait_exit(&mut agent.child.0, Duration::from_secs(60)).success());
    assert_eq!(pg.stored_and_distinct().await, (170, 170));
}

#[test]
fn plaintext_is_refused_unless_insecure_is_given() {
    let d = tempfile::tempdir().unwrap();
    let creds = d.path().join("credentials");
    railguard_e2e::write_secret(&creds, "node-a x\n");
    let out = Command::new(bin("railguard-collector"))
        .args(["serve", "--grpc-listen", "127.0.0.1:0", "--credentials"])
        .arg(&creds)
        .env("DATABASE_URL", "postgresql://unused@127.0.0.1:1/none")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing a plaintext agent link"), "{out:?}");
    let token = d.path().join("token");
    railguard_e2e::write_secret(&token, TOKEN_A);
    let out = Command::new(bin("railguard-agent"))
        .args(["run", "--collector", "http://127.0.0.1:1", "--no-signals", "--token-file"])
        .arg(&token)
        .arg("--spool-dir")
        .arg(d.path().join("spool"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing a plaintext link"), "{out:?}");
}

/// Secrets other local users can read are refused with the mode and the fix, never their
/// contents: the agent's token, the collector's credentials and its API token.
#[test]
fn secret_files_other_users_can_read_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let open = |p: &std::path::Path| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
    let token = d.path().join("token");
    railguard_e2e::write_secret(&token, TOKEN_A);
    open(&token);
    let out = Command::new(bin("railguard-agent"))
        .args(["run", "--insecure", "--collector", "http://127.0.0.1:1", "--no-signals", "--no-inline", "--token-file"])
        .arg(&token)
        .arg("--spool-dir")
        .arg(d.path().join("spool"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("is mode 0644") && err.contains("chmod 600"), "{err}");
    assert!(!err.contains(TOKEN_A), "{err}");

    let creds = d.path().join("credentials");
    railguard_e2e::write_secret(&creds, format!("node-a {TOKEN_A}\n"));
    open(&creds);
    let api = d.path().join("api-token");
    railguard_e2e::write_secret(&api, "api-secret-0123456789\n");
    for (flag, file) in [("--credentials", &creds), ("--api-token-file", &api)] {
        let ok_creds = d.path().join("ok-credentials");
        railguard_e2e::write_secret(&ok_creds, format!("node-a {TOKEN_A}\n"));
        open(&api);
        let mut c = Command::new(bin("railguard-collector"));
        c.args(["serve", "--insecure", "--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]);
        if flag == "--credentials" {
            c.arg("--credentials").arg(file);
        } else {
            c.arg("--credentials").arg(&ok_creds).arg(flag).arg(file);
        }
        let out = c.env("DATABASE_URL", "postgresql://unused@127.0.0.1:1/none").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: {err}");
        assert!(err.contains("is mode 0644"), "{flag}: {err}");
        assert!(!err.contains(TOKEN_A) && !err.contains("api-secret"), "{flag}: {err}");
    }
}

/// The HTTP side over TLS (`--http-tls-cert/--http-tls-key`): the API token and /metrics never
/// cross in clear, plaintext gets no answer; and it answers only its own Host names (IP
/// literals, localhost, `--http-allowed-host`), refusing a rebound name with 421.
#[tokio::test(flavor = "multi_thread")]
async fn the_http_side_serves_over_tls_and_answers_only_its_hosts() {
    let pg = TestPg::start().await;
    let d = tempfile::tempdir().unwrap();
    railguard_e2e::certs::server_and_client(d.path());
    let api = d.path().join("api-token");
    railguard_e2e::write_secret(&api, "api-secret-0123456789\n");
    let (cert, key) = (d.path().join("server.pem"), d.path().join("server.key"));
    let collector = CollectorProc::start_with(
        &pg.url(),
        &[],
        &[
            "--http-tls-cert",
            cert.to_str().unwrap(),
            "--http-tls-key",
            key.to_str().unwrap(),
            "--api-token-file",
            api.to_str().unwrap(),
            "--http-allowed-host",
            "collector.railguard.svc",
        ],
    );
    let port = collector.http_port;
    let ca = d.path().join("ca.pem");
    let curl = |args: &[&str]| -> (String, String) {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}"])
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.to_owned(), format!("{body}{}", String::from_utf8_lossy(&out.stderr)))
    };
    let url = |path: &str| format!("https://127.0.0.1:{port}{path}");
    let ca = ca.to_str().unwrap();
    // Verified against the CA, over TLS.
    assert_eq!(curl(&["--cacert", ca, &url("/healthz")]).0, "200");
    let bearer = "Authorization: Bearer api-secret-0123456789";
    assert_eq!(curl(&["--cacert", ca, "-H", bearer, &url("/api/v1/fleet")]).0, "200");
    assert_eq!(curl(&["--cacert", ca, &url("/api/v1/fleet")]).0, "401", "the token is still required");
    let (code, body) = curl(&["--cacert", ca, &url("/metrics")]);
    assert!(code == "200" && body.contains("railguard_ingest_batches_total"), "{code} {body}");
    // Plaintext to the same port: no HTTP answer at all.
    let (code, _) = curl(&[&format!("http://127.0.0.1:{port}/healthz")]);
    assert_ne!(code, "200", "plaintext must not be served");
    // Host names: the listed one, localhost and IP literals are answered; a rebound name is not.
    for (host, want) in
        [("collector.railguard.svc", "200"), ("localhost:1234", "200"), ("[::1]", "200"), ("evil.example", "421")]
    {
        let (code, body) = curl(&["--cacert", ca, "-H", &format!("Host: {host}"), "-H", bearer, &url("/api/v1/fleet")]);
        assert_eq!(code, want, "{host}: {body}");
        if want == "421" {
            assert!(body.contains("--http-allowed-host") && !body.contains("fleet"), "{body}");
        }
    }
}
