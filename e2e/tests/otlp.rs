//! The collector's and the agent's own traces and metrics reach an OTLP receiver when
//! OTEL_EXPORTER_OTLP_ENDPOINT is set (an in-process receiver on loopback).
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use railguard_e2e::*;

/// (service.name, span or metric name) pairs received.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<(String, String)>>>);

fn service_of(attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> String {
    attrs
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for rs in req.into_inner().resource_spans {
            let svc = service_of(&rs.resource.map(|r| r.attributes).unwrap_or_default());
            for ss in rs.scope_spans {
                for s in ss.spans {
                    self.0.lock().unwrap().push((svc.clone(), s.name));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        for rm in req.into_inner().resource_metrics {
            let svc = service_of(&rm.resource.map(|r| r.attributes).unwrap_or_default());
            for sm in rm.scope_metrics {
                for m in sm.metrics {
                    self.0.lock().unwrap().push((svc.clone(), m.name));
                }
            }
        }
        Ok(tonic::Response::new(ExportMetricsServiceResponse { partial_success: None }))
    }
}

/// An OTLP receiver (traces and metrics) on loopback, and its endpoint URL.
async fn receiver() -> (Receiver, String) {
    let recv = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", listener.local_addr().unwrap());
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(recv.clone()))
        .add_service(MetricsServiceServer::new(recv.clone()))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(server);
    (recv, otlp)
}

#[tokio::test(flavor = "multi_thread")]
async fn traces_and_metrics_reach_an_otlp_receiver() {
    let (recv, otlp) = receiver().await;

    let pg = TestPg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("creds");
    railguard_e2e::write_secret(&creds, format!("node-a {TOKEN_A}\n"));
    let (grpc, http) = free_port_pair();
    let mut collector = Command::new(bin("railguard-collector"))
        .args([
            "serve",
            "--insecure",
            "--grpc-listen",
            &format!("127.0.0.1:{grpc}"),
            "--http-listen",
            &format!("127.0.0.1:{http}"),
        ])
        .arg("--credentials")
        .arg(&creds)
        .env("DATABASE_URL", pg.url())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_port(grpc);
    let (spool, token) = filled_spool(dir.path(), 50);
    let mut agent = Command::new(bin("railguard-agent"))
        .args([
            "run",
            "--insecure",
            "--node-id",
            "node-a",
            "--collector",
            &format!("http://127.0.0.1:{grpc}"),
            "--exit-when-drained",
        ])
        .args(["--topology-interval", "0", "--probe-cycle-secs", "0", "--no-signals", "--batch-records", "10"])
        .arg("--token-file")
        .arg(&token)
        .arg("--spool-dir")
        .arg(&spool)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_exit(&mut agent, Duration::from_secs(60)).success());
    kill(Pid::from_raw(collector.id() as i32), Signal::SIGTERM).unwrap();
    assert!(wait_exit(&mut collector, Duration::from_secs(30)).success());

    let got = recv.0.lock().unwrap().clone();
    let has = |svc: &str, name: &str| got.iter().any(|(s, n)| s == svc && n == name);
    assert!(has("railguard-collector", "push_batch"), "{got:?}");
    assert!(has("railguard-agent", "ship_batch"), "{got:?}");
    assert!(has("railguard-collector", "railguard.ingest.records"), "{got:?}");
    assert_eq!(
        got.iter().filter(|(s, n)| s == "railguard-collector" && n == "push_batch").count(),
        5,
        "one span per batch"
    );
}

/// A real NIXL process (the wheel, agent/tests/nixl/workload.py) with its telemetry on: the
/// bytes it moved reach the OTLP receiver as `railguard.nixl.bytes`, and the agent's own
/// /metrics as `railguard_agent_nixl_bytes_total` (valid for `promtool check metrics`), labelled
/// by direction and the GPU its CUDA_VISIBLE_DEVICES names.
#[tokio::test(flavor = "multi_thread")]
async fn nixl_workload_bytes_are_an_otlp_counter() {
    let (recv, otlp) = receiver().await;

    let dir = tempfile::tempdir().unwrap();
    railguard_agent::topology::fixture::seed_kvm_guest().write(&dir.path().join("node")).unwrap();
    let tel = dir.path().join("telemetry");
    std::fs::create_dir(&tel).unwrap();
    let workload = concat!(env!("CARGO_MANIFEST_DIR"), "/../agent/tests/nixl/workload.py");
    // The workload in a process tree of the test's own: the agent consumes the NIXL rings of the
    // processes it sees, and sees no other test's.
    let ns = ProcNamespace::start();
    let said = dir.path().join("workload.out");
    let wl = ns.spawn(
        Spawn::new("python3")
            .arg(workload)
            // The NIXL the agent finds (scripts/setup.sh's wheel).
            .arg(railguard_agent::probe::transport::nixl::locate::locate(None, &|k| std::env::var(k).ok()).unwrap())
            .arg("60")
            .env("NIXL_TELEMETRY_ENABLE", "y")
            .env("NIXL_TELEMETRY_DIR", &tel)
            .env("CUDA_VISIBLE_DEVICES", "4")
            .stdout_to(&said),
    );
    let line = wait::until("the workload's first line", Duration::from_secs(60), || {
        let text = std::fs::read_to_string(&said).unwrap_or_default();
        text.lines().next().map(str::to_owned).ok_or("nothing yet")
    });
    assert!(line.starts_with("ready"), "{line}");
    // The agent exports over OTLP and serves its own /metrics (--metrics-listen) at once.
    let port = free_port();
    let mut watch = KillOnDrop(
        Command::new(bin("railguard-agent"))
            .args(["watch", "--json", "--no-ebpf", "--kmsg", "/dev/null", "--counter-interval-secs", "1"])
            .args(["--seconds", "15", "--metrics-listen", &format!("127.0.0.1:{port}"), "--proc-root"])
            .arg(ns.proc_root())
            .arg("--sysfs-root")
            .arg(dir.path().join("node/sys"))
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port);
    // The workload's decode side READs: received bytes, on GPU4 (NIXL flushes its telemetry
    // every 100 ms; the agent reads the ring every second while it runs).
    let text = wait::until("NIXL bytes on the agent's /metrics", Duration::from_secs(15), || {
        let (code, body) = http_get(port, "/metrics", None);
        assert_eq!(code, 200, "{body}");
        if body.lines().any(|l| {
            l.starts_with("railguard_agent_nixl_bytes_total{direction=\"rx\",gpu=\"4\"}") && !l.ends_with(" 0")
        }) {
            Ok(body)
        } else {
            Err(body)
        }
    });
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut check.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let st = tokio::task::spawn_blocking(move || wait_exit(&mut watch.0, Duration::from_secs(30))).await.unwrap();
    assert!(st.success());
    ns.kill(wl);
    let got = recv.0.lock().unwrap().clone();
    assert!(got.iter().any(|(s, n)| s == "railguard-agent" && n == "railguard.nixl.bytes"), "{got:?}");
}
