//! One node cannot stop the assessment of the others: a batch with counts beyond any agent is
//! refused at the door, and the same numbers stored behind ingest's back (a row corrupted in
//! SQL) leave only their own node `unknown` while every other node is assessed on time, across a
//! restart of the collector. Then 10,000 records with every numeric field at its extremes.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use chrono::Utc;
use railguard_e2e::scripted::*;
use railguard_e2e::*;
use railguard_schema::wire::ingest_client::IngestClient;
use railguard_schema::wire::{self, RecordBatch};
use railguard_schema::{
    DataPath, Memory, PairSelection, ProbeSummary, ProbeSummarySet, ProbeVerdict, Record, RecordBody, RecordId,
};
use tonic::Code;

async fn status(pg: &TestPg, node: &str, gpu: i32) -> Option<(String, String)> {
    sqlx::query_as("SELECT status::text, reasons->>0 FROM gpu_status WHERE node_id = $1 AND gpu_index = $2")
        .bind(node)
        .bind(gpu)
        .fetch_optional(&pg.pool)
        .await
        .unwrap()
        .map(|(s, r): (String, Option<String>)| (s, r.unwrap_or_default()))
}

async fn wait_status(pg: &TestPg, node: &str, gpu: i32, want: &str, within: Duration) -> String {
    wait::until_async(&format!("{node} GPU{gpu} {want}"), within, async || match status(pg, node, gpu).await {
        Some((s, why)) if s == want => Ok(why),
        other => Err(format!("{other:?}")),
    })
    .await
}

/// `n` probes of one pair, the oldest `oldest_ago_s` seconds old, a second apart.
fn probes(gpu: u32, nic: &str, v: ProbeVerdict, sel: PairSelection, n: i64, oldest_ago_s: i64) -> Vec<wire::Record> {
    (0..n).map(|k| probe_rec(gpu, nic, v, sel, oldest_ago_s - k)).collect()
}

fn summaries(gpu: u32, nic: &str, probes: u32, n: usize) -> wire::Record {
    let now = Utc::now();
    let s = ProbeSummary {
        gpu,
        gpu_bdf: None,
        nic: nic.into(),
        nic_bdf: None,
        transport: railguard_schema::Transport::Sim,
        memory: Memory::Host,
        path: DataPath::Simulated,
        injected: railguard_schema::Injected::None,
        simulated: true,
        selection: PairSelection::Predicted,
        lanes: vec![],
        probes,
        bytes: 64 << 20,
        duration_min_ns: 1,
        duration_median_ns: 2,
        duration_max_ns: 3,
        first_at: now - chrono::Duration::seconds(50),
        last_at: now - chrono::Duration::seconds(40),
    };
    let set = ProbeSummarySet { summaries: vec![s; n] };
    Record {
        id: RecordId::random(),
        observed_at: now - chrono::Duration::seconds(40),
        body: RecordBody::Summaries(set),
    }
    .into()
}

async fn push(c: &CollectorProc, node: &str, records: Vec<wire::Record>) -> Result<(), tonic::Status> {
    let mut client = IngestClient::connect(c.url()).await.unwrap();
    client
        .push_batch(with_token(
            RecordBatch { node_id: node.into(), records, spool_dropped_total: 0, state: None },
            &token_for(node),
        ))
        .await
        .map(|_| ())
}

fn metric(c: &CollectorProc, name: &str) -> Option<f64> {
    let (_, body) = c.get("/metrics", None);
    body.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn one_nodes_extreme_counts_are_refused_and_stored_ones_leave_only_that_node_unknown() {
    let pg = TestPg::start().await;
    let mut c = CollectorProc::start_with(&pg.url(), &["hostile", "victim"], &["--assess-every-secs", "2"]);
    let seed = topology(&railguard_agent::topology::fixture::dgx_h100_like(), None);
    for node in ["hostile", "victim"] {
        send(&c, node, vec![topo_rec(seed.clone())]).await;
        send(&c, node, probes(3, "mlx5_3", ProbeVerdict::Ok, PairSelection::Predicted, 3, 30)).await;
    }
    wait_status(&pg, "victim", 3, "ok", Duration::from_secs(20)).await;

    // The batch that stopped every node's assessment: three summaries near u32::MAX and a
    // failure. Refused whole, with the field named.
    let mut batch = vec![summaries(3, "mlx5_3", u32::MAX - 1, 3)];
    batch.push(probe_rec(3, "mlx5_3", ProbeVerdict::SilentCorruption, PairSelection::Predicted, 1));
    let e = push(&c, "hostile", batch).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("summary.probes"), "{e:?}");

    // The same numbers stored behind ingest's back: a valid set, then its counts raised in SQL.
    push(&c, "hostile", vec![summaries(3, "mlx5_3", 5, 3)]).await.unwrap();
    sqlx::query(
        "UPDATE probe_summary_sets SET probes = ARRAY[2147483647, 2147483647, 2147483647] WHERE node_id = 'hostile'",
    )
    .execute(&pg.pool)
    .await
    .unwrap();
    push(&c, "hostile", vec![probe_rec(3, "mlx5_3", ProbeVerdict::SilentCorruption, PairSelection::Predicted, 1)])
        .await
        .unwrap();
    let why = wait_status(&pg, "hostile", 3, "unknown", Duration::from_secs(20)).await;
    assert!(why.contains("not assessed") && why.contains("probes"), "{why}");
    // Every GPU of the node, not only the one the row names.
    assert_eq!(status(&pg, "hostile", 0).await.unwrap().0, "unknown");

    // The victim's new failure is assessed at once all the same.
    send(&c, "victim", probes(3, "mlx5_3", ProbeVerdict::SilentCorruption, PairSelection::Predicted, 2, 2)).await;
    wait_status(&pg, "victim", 3, "corrupting", Duration::from_secs(20)).await;
    assert_eq!(metric(&c, "railguard_assessment_unassessed_nodes"), Some(1.0));
    assert!(metric(&c, "railguard_assessment_isolated_total{why=\"damaged_row\"}").unwrap() >= 1.0);

    // A restart with the row still in the window: the collector assesses on.
    c.restart();
    send(&c, "victim", probes(5, "mlx5_5", ProbeVerdict::SilentCorruption, PairSelection::Sweep, 3, 3)).await;
    send(&c, "victim", probes(6, "mlx5_6", ProbeVerdict::Ok, PairSelection::Predicted, 3, 3)).await;
    wait_status(&pg, "victim", 6, "ok", Duration::from_secs(20)).await;
    assert!(c.is_running());

    // A topology row corrupted in SQL: the node is unknown, with that reason; the victim goes on.
    sqlx::query("DELETE FROM probe_summary_sets WHERE node_id = 'hostile'").execute(&pg.pool).await.unwrap();
    sqlx::query("UPDATE topology_snapshots SET risks = '{\"not\": \"a list\"}' WHERE node_id = 'hostile'")
        .execute(&pg.pool)
        .await
        .unwrap();
    push(&c, "hostile", vec![probe_rec(3, "mlx5_3", ProbeVerdict::SilentCorruption, PairSelection::Predicted, 1)])
        .await
        .unwrap();
    wait::until_async("the hostile node's undecodable row noted", Duration::from_secs(40), async || {
        let why = status(&pg, "hostile", 3).await.unwrap().1;
        if why.contains("no longer decode") { Ok(()) } else { Err(why) }
    })
    .await;
    // A probe row naming a GPU no node has: noted, never counted on GPU 0.
    sqlx::query("UPDATE probe_results SET gpu_index = -5 WHERE node_id = 'victim' AND gpu_index = 6")
        .execute(&pg.pool)
        .await
        .unwrap();
    send(&c, "victim", vec![probe_rec(6, "mlx5_6", ProbeVerdict::SilentCorruption, PairSelection::Predicted, 1)]).await;
    let why = wait_status(&pg, "victim", 6, "unknown", Duration::from_secs(20)).await;
    assert!(why.contains("GPU index -5"), "{why}");
    assert_ne!(status(&pg, "victim", 0).await.map(|s| s.0).as_deref(), Some("corrupting"));
    assert_eq!(status(&pg, "hostile", 3).await.unwrap().0, "unknown");
}

/// Every numeric field of every record kind at 0, its maximum, maximum − 1 or random, one record
/// a batch: whatever ingest accepts is stored, nothing stops the assessment, and the other node's
/// failure is assessed at once.
#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_extreme_records_leave_every_other_node_assessed() {
    use rand::Rng;
    let pg = TestPg::start().await;
    let c = CollectorProc::start_with(&pg.url(), &["hostile", "victim"], &["--assess-every-secs", "1"]);
    let seed = topology(&railguard_agent::topology::fixture::dgx_h100_like(), None);
    send(&c, "victim", vec![topo_rec(seed.clone())]).await;
    send(&c, "hostile", vec![topo_rec(seed)]).await;
    let mut rng = rand::rng();
    let pick32 = |rng: &mut rand::rngs::ThreadRng| match rng.random_range(0..4) {
        0 => 0u32,
        1 => u32::MAX,
        2 => u32::MAX - 1,
        _ => rng.random(),
    };
    let pick64 = |rng: &mut rand::rngs::ThreadRng| match rng.random_range(0..4) {
        0 => 0u64,
        1 => u64::MAX,
        2 => u64::MAX - 1,
        _ => rng.random(),
    };
    let now_ns = Utc::now().timestamp_nanos_opt().unwrap();
    let mut client = IngestClient::connect(c.url()).await.unwrap();
    let (mut stored, mut refused) = (0, 0);
    for i in 0..10_000u64 {
        let mut r: wire::Record = if i % 4 == 0 {
            summaries(3, "mlx5_3", 5, 3)
        } else {
            probe_rec((i % 8) as u32, &format!("mlx5_{}", i % 8), ProbeVerdict::Ok, PairSelection::Sweep, 5)
        };
        // One field a record at an extreme (0, its maximum, maximum − 1, or random), the field
        // moving on record by record: each extreme reaches ingest alone, and what it accepts
        // reaches the assessment.
        let field = (i / 4) % 8;
        if field == 7 {
            r.observed_at_unix_ns = match rng.random_range(0..4) {
                0 => 0,
                1 => i64::MAX,
                2 => i64::MAX - 1,
                _ => now_ns - rng.random_range(0..600_000_000_000),
            };
        }
        match r.body.as_mut().unwrap() {
            wire::record::Body::Probe(p) => {
                p.verdict = 1 + (i % 4) as i32;
                match field {
                    0 => p.gpu_index = pick32(&mut rng),
                    1 => p.bytes = pick64(&mut rng),
                    2 => p.chunks = pick32(&mut rng),
                    3 => p.bad_chunks = pick32(&mut rng),
                    4 => p.duration_ns = pick64(&mut rng),
                    5 => p.bit_flips = pick64(&mut rng),
                    6 => p.first_bad_offset = Some(pick64(&mut rng)),
                    _ => {}
                }
            }
            wire::record::Body::Summaries(s) => {
                for m in &mut s.summaries {
                    match field {
                        0 => m.gpu_index = pick32(&mut rng),
                        1 => m.bytes = pick64(&mut rng),
                        2 | 3 => m.probes = pick32(&mut rng),
                        4 => m.duration_max_ns = pick64(&mut rng),
                        _ => {}
                    }
                }
            }
            _ => unreachable!(),
        }
        let req = with_token(
            RecordBatch { node_id: "hostile".into(), records: vec![r], spool_dropped_total: 0, state: None },
            &token_for("hostile"),
        );
        match client.push_batch(req).await {
            Ok(_) => stored += 1,
            Err(e) if e.code() == Code::InvalidArgument => refused += 1,
            Err(e) => panic!("record {i}: {e:?}"),
        }
        if i == 5_000 {
            // Half-way, the other node's failure is assessed at once.
            send(&c, "victim", probes(2, "mlx5_2", ProbeVerdict::SilentCorruption, PairSelection::Predicted, 2, 2))
                .await;
            wait_status(&pg, "victim", 2, "corrupting", Duration::from_secs(20)).await;
        }
    }
    eprintln!("extreme records: {stored} stored, {refused} refused");
    assert!(stored > 100 && refused > 1_000, "{stored} stored, {refused} refused");
    // The periodic passes went on: a fresh GPU of the victim is assessed within seconds.
    send(&c, "victim", probes(4, "mlx5_4", ProbeVerdict::Ok, PairSelection::Predicted, 3, 3)).await;
    wait_status(&pg, "victim", 4, "ok", Duration::from_secs(20)).await;
    assert_eq!(metric(&c, "railguard_assessment_pass_panics_total"), Some(0.0));
    let (_, fleet) = c.get("/api/v1/fleet", None);
    assert!(fleet.contains("hostile"), "{fleet}");
}

/// A topology record dated `ahead_s` seconds after now.
fn topo_at(t: railguard_schema::TopologySnapshot, ahead_s: i64) -> wire::Record {
    Record {
        id: RecordId::random(),
        observed_at: Utc::now() + chrono::Duration::seconds(ahead_s),
        body: RecordBody::Topology(t),
    }
    .into()
}

async fn push_dropped(
    c: &CollectorProc,
    node: &str,
    records: Vec<wire::Record>,
    dropped: u64,
) -> Result<(), tonic::Status> {
    let mut client = IngestClient::connect(c.url()).await.unwrap();
    client
        .push_batch(with_token(
            RecordBatch { node_id: node.into(), records, spool_dropped_total: dropped, state: None },
            &token_for(node),
        ))
        .await
        .map(|_| ())
}

/// A node's clock and counters cannot outrank the collector: a topology dated a day ahead is
/// refused (and the clock-ahead gauge keeps the lead), one dated a few minutes ahead is stored
/// but the snapshot received after it is the node's latest, and a spool drop count beyond any
/// agent's is refused without touching the node's counter.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_s_clock_and_counters_cannot_outrank_the_collector() {
    let pg = TestPg::start().await;
    let c = CollectorProc::start_with(&pg.url(), &["skewed"], &[]);
    let seed = topology(&railguard_agent::topology::fixture::seed_kvm_guest(), None);
    let dgx = topology(&railguard_agent::topology::fixture::dgx_h100_like(), None);

    // A day ahead: refused whole, said why; the gauge shows the lead and keeps it.
    let e = push(&c, "skewed", vec![topo_at(seed.clone(), 86_400)]).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("ahead"), "{}", e.message());
    let ahead = |c: &CollectorProc| metric(c, "railguard_agent_clock_ahead_seconds{node=\"skewed\"}");
    assert!(ahead(&c).is_some_and(|a| a > 86_000.0), "{:?}", ahead(&c));

    // Four minutes ahead (within the bound): stored. Then a genuine snapshot, dated now: it
    // was received last, so it is the node's latest, though its agent time is earlier.
    push(&c, "skewed", vec![topo_at(seed, 240)]).await.unwrap();
    push(&c, "skewed", vec![topo_at(dgx, 0)]).await.unwrap();
    let (hypervisor, n): (String, i64) = sqlx::query_as(
        "SELECT (SELECT hypervisor FROM latest_topology WHERE node_id = 'skewed'),
                (SELECT count(*) FROM topology_snapshots WHERE node_id = 'skewed')",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert_eq!((hypervisor.as_str(), n), ("", 2), "the bare-metal snapshot received last is the latest");
    assert!(ahead(&c).is_some_and(|a| a > 86_000.0), "the gauge keeps its maximum: {:?}", ahead(&c));

    // Spool drops: a plausible count is kept; u64::MAX is refused and changes nothing.
    push_dropped(&c, "skewed", vec![], 5).await.unwrap();
    let e = push_dropped(&c, "skewed", vec![], u64::MAX).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let dropped: i64 = sqlx::query_scalar("SELECT spool_dropped_total FROM nodes WHERE node_id = 'skewed'")
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert_eq!(dropped, 5);
}
