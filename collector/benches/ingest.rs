//! Ingest throughput: batches of 1,000 probe records through the real gRPC service into a
//! durable private Postgres, against a raw `COPY` of the same rows into the same table in the
//! same run. Run: `cargo bench -p railguard-collector --bench ingest` (env BATCHES=N to resize).
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use railguard_collector::ingest::auth::Credentials;
use railguard_collector::serve::serve_grpc;
use railguard_collector::store::Store;
use railguard_collector::store::pg::{PrivateCluster, connect_and_migrate};
use railguard_schema::wire::ingest_client::IngestClient;
use railguard_schema::wire::{self, RecordBatch};
use railguard_schema::*;
use sqlx::PgPool;

const BATCH: usize = 1_000;
const TOKEN: &str = "bench-token-0123456789";

fn probe(i: usize) -> ProbeResult {
    ProbeResult {
        gpu: (i % 8) as u32,
        gpu_bdf: Some(Bdf::new(0, 0x18 + (i % 8) as u8, 0, 0)),
        nic: format!("mlx5_{}", i % 8),
        nic_bdf: Some(Bdf::new(0, 0x19 + (i % 8) as u8, 0, 0)),
        transport: Transport::Sim,
        bytes: 64 << 20,
        reported: Reported::Success,
        reported_detail: String::new(),
        verdict: ProbeVerdict::Ok,
        diagnosis: Diagnosis::None,
        first_bad_offset: None,
        bad_chunks: 0,
        chunks: 64,
        duration_ns: 1_000_000 + i as u64,
        selection: PairSelection::Sweep,
        simulated: true,
        bit_flips: 0,
        receiver_detail: String::new(),
        memory: railguard_schema::Memory::Host,
        path: railguard_schema::DataPath::Simulated,
        injected: railguard_schema::Injected::None,
        lanes: Vec::new(),
    }
}

fn batches(n: usize) -> Vec<Vec<Record>> {
    (0..n)
        .map(|b| {
            (0..BATCH)
                .map(|i| Record {
                    id: RecordId::random(),
                    observed_at: Utc::now(),
                    body: RecordBody::Probe(probe(b * BATCH + i)),
                })
                .collect()
        })
        .collect()
}

fn copy_text(batch: &[Record]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for r in batch {
        let RecordBody::Probe(p) = &r.body else { unreachable!() };
        let opt = |b: Option<Bdf>| b.map(|b| b.to_string()).unwrap_or_else(|| "\\N".into());
        writeln!(
            s,
            "{}\tbench\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t\\N\t{}\t{}\t{}\t{}\t{}",
            r.id,
            r.observed_at.to_rfc3339(),
            p.gpu,
            opt(p.gpu_bdf),
            p.nic,
            opt(p.nic_bdf),
            p.transport,
            p.bytes,
            p.reported,
            p.reported_detail,
            p.verdict,
            p.diagnosis,
            p.bad_chunks,
            p.chunks,
            p.duration_ns,
            p.selection,
            p.simulated
        )
        .unwrap();
    }
    s
}

async fn raw_copy(pool: &PgPool, texts: &[String]) -> Duration {
    let start = Instant::now();
    for t in texts {
        let mut conn = pool.acquire().await.unwrap();
        let mut copy = conn
            .copy_in_raw(
                "COPY probe_results (record_id, node_id, observed_at, gpu_index, gpu_bdf, nic, nic_bdf, transport, bytes, \
                 reported, reported_detail, verdict, diagnosis, first_bad_offset, bad_chunks, chunks, duration_ns, selection, simulated) \
                 FROM STDIN",
            )
            .await
            .unwrap();
        copy.send(t.as_bytes()).await.unwrap();
        copy.finish().await.unwrap();
    }
    start.elapsed()
}

#[tokio::main]
async fn main() {
    let n_batches: usize = std::env::var("BATCHES").ok().and_then(|s| s.parse().ok()).unwrap_or(50);
    let dir = tempfile::Builder::new().prefix("railguard-bench-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("pg");
    let cluster = tokio::task::spawn_blocking(move || PrivateCluster::start(&data, true)).await.unwrap().unwrap();
    cluster.create_database("bench").await.unwrap();
    let pool = connect_and_migrate(cluster.connect_options("bench"), 8).await.unwrap();

    let mut creds = Credentials::default();
    creds.insert(NodeId::new("bench").unwrap(), TOKEN);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let store = Store::new(pool.clone());
    tokio::spawn(serve_grpc(
        railguard_collector::conns::accept(
            listener,
            railguard_collector::conns::ConnLimits::GRPC_DEFAULT,
            Arc::default(),
            "agent",
        ),
        store.clone(),
        Arc::new(creds),
        Arc::default(),
        Arc::default(),
        None,
        std::future::pending(),
    ));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(railguard_schema::limits::HTTP2_WINDOW_BYTES))
        .initial_connection_window_size(Some(railguard_schema::limits::HTTP2_WINDOW_BYTES))
        .connect()
        .await
        .unwrap();
    let mut client = IngestClient::new(channel);

    // Warm up: partitions, connections, plans.
    let warm: Vec<wire::Record> = batches(1).remove(0).into_iter().map(Into::into).collect();
    let mut req = tonic::Request::new(RecordBatch {
        node_id: "bench".into(),
        records: warm,
        spool_dropped_total: 0,
        state: None,
    });
    req.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    client.push_batch(req).await.unwrap();
    raw_copy(&pool, &[copy_text(&batches(1)[0])]).await;

    // gRPC path (validation, auth, transaction, UNNEST insert, ack after commit).
    let grpc_batches: Vec<Vec<wire::Record>> =
        batches(n_batches).into_iter().map(|b| b.into_iter().map(Into::into).collect()).collect();
    let start = Instant::now();
    for b in grpc_batches {
        let mut req = tonic::Request::new(RecordBatch {
            node_id: "bench".into(),
            records: b,
            spool_dropped_total: 0,
            state: None,
        });
        req.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        let ack = client.push_batch(req).await.unwrap().into_inner();
        assert_eq!(ack.stored as usize, BATCH);
    }
    let grpc = start.elapsed();

    // Store only (no gRPC): what the database side costs.
    let store_batches = batches(n_batches);
    let node = NodeId::new("bench").unwrap();
    let start = Instant::now();
    for b in store_batches {
        store.ingest(&node, b, 0).await.unwrap();
    }
    let store_only = start.elapsed();

    // Raw COPY of the same shape of rows, 1,000 per COPY, each its own transaction.
    let texts: Vec<String> = batches(n_batches).iter().map(|b| copy_text(b)).collect();
    let copy = raw_copy(&pool, &texts).await;

    let records = (n_batches * BATCH) as f64;
    let rate = |d: Duration| records / d.as_secs_f64();
    println!("ingest benchmark: {n_batches} batches x {BATCH} probe records, durable Postgres (fsync on), one client");
    println!("  grpc ingest   {:>10.0} records/s", rate(grpc));
    println!("  store only    {:>10.0} records/s", rate(store_only));
    println!("  raw COPY      {:>10.0} records/s", rate(copy));
    println!("  ratio grpc/COPY  {:.2}  (goal >= 0.5)", rate(grpc) / rate(copy));
    println!("  ratio store/COPY {:.2}", rate(store_only) / rate(copy));
    drop(client);
    pool.close().await;
    cluster.stop().unwrap();
}
