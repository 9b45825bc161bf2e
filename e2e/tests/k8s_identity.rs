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
