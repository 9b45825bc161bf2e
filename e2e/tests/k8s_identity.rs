//! Agents authenticated by their Kubernetes service-account token instead of a distributed
//! secret: the collector verifies the token against the cluster's key set (a test key set
//! here, collector/tests/fixtures) and the node the token names is the only node it may write
//! as. Real agent binary, real gRPC, real Postgres.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::process::{Command, Stdio};
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use railguard_e2e::*;
use railguard_schema::wire::RecordBatch;
use railguard_schema::wire::ingest_client::IngestClient;
use tonic::Code;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../collector/tests/fixtures");
const ISSUER: &str = "https://kubernetes.default.svc";

/// A token as the kubelet projects it for the agent pod on `node`, expiring in `exp_in` s.
fn sa_token(node: &str, exp_in: i64) -> String {
    let now = chrono::Utc::now().timestamp();
    let claims = serde_json::json!({
        "aud": ["railguard"], "exp": now + exp_in, "iat": now - 10, "nbf": now - 10, "iss": ISSUER,
        "sub": "system:serviceaccount:railguard:agent",
        "kubernetes.io": {"namespace": "railguard", "node": {"name": node, "uid": "n1"},
                          "pod": {"name": "agent-abcde", "uid": "p1"}, "serviceaccount": {"name": "agent", "uid": "s1"}}
    });
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some("test-key-1".into());
    let key = std::fs::read(format!("{FIXTURES}/k8s-sa-test-key.pem")).unwrap();
    jsonwebtoken::encode(&h, &claims, &EncodingKey::from_rsa_pem(&key).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn agents_write_as_the_node_their_service_account_token_names() {
    let pg = TestPg::start().await;
    let jwks = format!("{FIXTURES}/k8s-sa-test-jwks.json");
    let collector = CollectorProc::start_with(&pg.url(), &[], &["--k8s-jwks", &jwks, "--k8s-issuer", ISSUER]);

    // The real agent, its token file holding the projected token of node gpu-node-7.
    let dir = tempfile::tempdir().unwrap();
    let (spool, token_file) = filled_spool(dir.path(), 500);
    railguard_e2e::write_secret(&token_file, sa_token("gpu-node-7", 3600));
    let mut agent = Command::new(bin("railguard-agent"))
        .args(["run", "--insecure", "--node-id", "gpu-node-7", "--collector", &collector.url(), "--exit-when-drained"])
        .args(["--topology-interval", "0", "--probe-cycle-secs", "0", "--no-signals", "--backoff-max-ms", "500"])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--spool-dir")
        .arg(&spool)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_exit(&mut agent, Duration::from_secs(60)).success());
    assert_eq!(pg.count("probe_results").await + pg.count("signal_events").await, 500);
    let node: String =
        sqlx::query_scalar("SELECT DISTINCT node_id FROM probe_results").fetch_one(&pg.pool).await.unwrap();
    assert_eq!(node, "gpu-node-7");

    // The same token cannot write as another node; expired, forged or foreign tokens get nowhere.
    let mut client = IngestClient::connect(collector.url()).await.unwrap();
    let batch =
        |node: &str| RecordBatch { node_id: node.into(), records: records(3), spool_dropped_total: 0, state: None };
    let err = client.push_batch(with_token(batch("gpu-node-8"), &sa_token("gpu-node-7", 3600))).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("gpu-node-7"), "{err:?}");
    let err = client.push_batch(with_token(batch("gpu-node-7"), &sa_token("gpu-node-7", -600))).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("service-account token") && err.message().contains("Expired"), "{err:?}");
    let good = sa_token("gpu-node-7", 3600);
    let at = good.len() - 20; // inside the signature
    let flipped = if &good[at..at + 1] == "A" { "B" } else { "A" };
    let forged = format!("{}{flipped}{}", &good[..at], &good[at + 1..]);
    let err = client.push_batch(with_token(batch("gpu-node-7"), &forged)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    // Static tokens keep working beside it.
    client.push_batch(with_token(batch("node-a"), TOKEN_A)).await.unwrap();
    assert_eq!(pg.count("probe_results").await + pg.count("signal_events").await, 503);
}

/// An API server of the test's own: python3's HTTPS server with `certs`' server certificate,
/// answering GET /openid/v1/jwks with `jwks` for a caller presenting `Bearer token` (401 without
/// it, 404 for any other path), and writing each path it was asked for to `log`.
fn api_server_stand_in(
    port: u16,
    certs: &std::path::Path,
    jwks: &str,
    token: &str,
    log: &std::path::Path,
) -> KillOnDrop {
    const SERVER: &str = r#"
import http.server, ssl, sys
port, cert, key, jwks, token, log = sys.argv[1:]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as f:
            f.write(self.path + "\n")
        if self.headers.get("Authorization") != "Bearer " + token:
            self.send_response(401); self.end_headers(); return
        if self.path != "/openid/v1/jwks":
            self.send_response(404); self.end_headers(); return
        body = open(jwks, "rb").read()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", int(port)), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
s.socket = ctx.wrap_socket(s.socket, server_side=True)
s.serve_forever()
"#;
    let child = Command::new("python3")
        .args(["-c", SERVER, &port.to_string()])
        .arg(certs.join("server.pem"))
        .arg(certs.join("server.key"))
        .args([jwks, token])
        .arg(log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_port(port);
    KillOnDrop(child)
}

/// The collector binary with `--k8s-jwks-from-api`: it finds the API server through KUBECONFIG
/// (server, CA, its own token from a file), fetches the cluster's key set there, and an agent's
/// projected token verifies against it; the static tokens still work beside it.
#[tokio::test(flavor = "multi_thread")]
async fn the_key_set_is_fetched_from_the_api_server_the_kubeconfig_names() {
    let pg = TestPg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    railguard_e2e::certs::server_and_client(&certs);
    let port = free_port();
    let log = dir.path().join("asked");
    let token = dir.path().join("collector-token");
    railguard_e2e::write_secret(&token, "collector-sa-token-for-the-test");
    let _api = api_server_stand_in(
        port,
        &certs,
        &format!("{FIXTURES}/k8s-sa-test-jwks.json"),
        "collector-sa-token-for-the-test",
        &log,
    );
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
             clusters: [{{name: test, cluster: {{server: \"https://127.0.0.1:{port}\", certificate-authority: {ca}}}}}]\n\
             users: [{{name: collector, user: {{tokenFile: {token}}}}}]\n\
             contexts: [{{name: test, context: {{cluster: test, user: collector}}}}]\n",
            ca = certs.join("ca.pem").display(),
            token = token.display()
        ),
    )
    .unwrap();
    let collector = CollectorProc::start_with_env(
        &pg.url(),
        &[],
        &["--k8s-jwks-from-api", "--k8s-issuer", ISSUER],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let mut client = IngestClient::connect(collector.url()).await.unwrap();
    let batch =
        || RecordBatch { node_id: "gpu-node-7".into(), records: records(3), spool_dropped_total: 0, state: None };
    wait::until_async("the agent's token accepted with the fetched keys", Duration::from_secs(60), async || {
        client.push_batch(with_token(batch(), &sa_token("gpu-node-7", 3600))).await.map_err(|e| format!("{e:?}"))
    })
    .await;
    assert_eq!(pg.count("probe_results").await + pg.count("signal_events").await, 3);
    let asked = std::fs::read_to_string(&log).unwrap();
    assert!(asked.lines().all(|l| l == "/openid/v1/jwks"), "it asked for nothing else: {asked}");
    client
        .push_batch(with_token(
            RecordBatch { node_id: "node-a".into(), records: records(3), spool_dropped_total: 0, state: None },
            TOKEN_A,
        ))
        .await
        .unwrap();
}
