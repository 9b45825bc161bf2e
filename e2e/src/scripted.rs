//! Scripted record streams for the API and dashboard tests: the seed under auto-selection, the
//! seed pinned to mlx5_0:1, a healthy node with one transient failure, an Xid storm on one GPU.

use std::time::Duration;

use chrono::{DateTime, Utc};
use railguard_agent::topology::fixture::{self, FixtureSpec};
use railguard_agent::topology::predict::NetDevices;
use railguard_agent::topology::{SelectionPolicy, SysRoot, Topology};
use railguard_schema::wire::RecordBatch;
use railguard_schema::wire::ingest_client::IngestClient;
use railguard_schema::*;
use serde_json::Value;

use crate::*;

pub fn topology(spec: &FixtureSpec, pin: Option<&str>) -> TopologySnapshot {
    let d = tempfile::tempdir().unwrap();
    spec.write(d.path()).unwrap();
    let t = Topology::discover(&SysRoot::new(d.path().join("sys")), &SysRoot::new(d.path().join("proc")));
    let policy = SelectionPolicy { ucx: pin.map(NetDevices::parse).unwrap_or_default(), ..Default::default() };
    t.to_snapshot(&policy)
}

pub fn probe_rec(gpu: u32, nic: &str, verdict: ProbeVerdict, selection: PairSelection, ago_s: i64) -> wire::Record {
    let mut p = probe(0);
    p.gpu = gpu;
    p.nic = nic.into();
    p.verdict = verdict;
    p.selection = selection;
    p.diagnosis = if verdict == ProbeVerdict::SilentCorruption { Diagnosis::Untouched } else { Diagnosis::None };
    // Simulated nodes: the fabric stands in for the NIC, and the buffers are host memory.
    if verdict == ProbeVerdict::Timeout {
        p.reported = Reported::Nothing;
        p.diagnosis = Diagnosis::Untouched;
    }
    Record {
        id: RecordId::random(),
        observed_at: Utc::now() - chrono::Duration::seconds(ago_s),
        body: RecordBody::Probe(p),
    }
    .into()
}

/// A probe of `gpu` on `nic` as an agent of real hardware sends it: what carried it, in which
/// memory, on which lanes.
pub fn probe_at(gpu: u32, nic: &str, path: DataPath, memory: Memory, lanes: &[&str], ago_s: i64) -> wire::Record {
    let mut p = probe(0);
    p.gpu = gpu;
    p.nic = nic.into();
    p.verdict = ProbeVerdict::Ok;
    p.diagnosis = Diagnosis::None;
    p.first_bad_offset = None;
    p.bad_chunks = 0;
    p.selection = PairSelection::Predicted;
    p.transport = Transport::Verbs;
    p.simulated = false;
    p.path = path;
    p.memory = memory;
    p.lanes = lanes.iter().map(|l| (*l).to_owned()).collect();
    Record {
        id: RecordId::random(),
        observed_at: Utc::now() - chrono::Duration::seconds(ago_s),
        body: RecordBody::Probe(p),
    }
    .into()
}

/// `n` probes of GPU `gpu` through its own NIC `mlx5_<gpu>` in `memory`, the newest `ago_s` back.
pub fn own_at(gpu: u32, memory: Memory, n: i64, ago_s: i64) -> Vec<wire::Record> {
    let nic = format!("mlx5_{gpu}");
    let lane = format!("rc_mlx5/{nic}:1");
    (0..n).map(|k| probe_at(gpu, &nic, DataPath::NicDma, memory, &[&lane], ago_s + k)).collect()
}

/// The probe stream of an 8-GPU node whose PIX pairs reject DMA, with `workload(g)` the NIC
/// each GPU's workload uses: 4 probes of that pair, 1 of every other pair.
pub fn seed_probes(workload: impl Fn(u32) -> String, selection: PairSelection) -> Vec<wire::Record> {
    let mut v = Vec::new();
    for g in 0..8u32 {
        for n in 0..8u32 {
            let nic = format!("mlx5_{n}");
            let verdict = if n == g { ProbeVerdict::SilentCorruption } else { ProbeVerdict::Ok };
            let (count, sel) = if nic == workload(g) { (4, selection) } else { (1, PairSelection::Sweep) };
            for k in 0..count {
                v.push(probe_rec(g, &nic, verdict, sel, 60 - k * 10));
            }
        }
    }
    v
}

pub async fn send(collector: &CollectorProc, node: &str, records: Vec<wire::Record>) {
    let mut client = IngestClient::connect(collector.url()).await.unwrap();
    for chunk in records.chunks(1000) {
        let mut req = tonic::Request::new(RecordBatch {
            node_id: node.into(),
            records: chunk.to_vec(),
            spool_dropped_total: 0,
            state: None,
        });
        req.metadata_mut().insert("authorization", format!("Bearer {}", token_for(node)).parse().unwrap());
        client.push_batch(req).await.unwrap();
    }
}

pub fn topo_rec(t: TopologySnapshot) -> wire::Record {
    Record {
        id: RecordId::random(),
        observed_at: Utc::now() - chrono::Duration::seconds(120),
        body: RecordBody::Topology(t),
    }
    .into()
}

pub fn json(c: &CollectorProc, path: &str) -> Value {
    let (code, body) = c.get(path, None);
    assert_eq!(code, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

pub fn statuses(c: &CollectorProc, node: &str) -> Vec<String> {
    let v = json(c, &format!("/api/v1/nodes/{node}"));
    v["gpus"].as_array().unwrap().iter().map(|g| g["status"].as_str().unwrap().to_owned()).collect()
}

pub const NODES: [&str; 5] = ["seed-auto", "seed-pinned", "healthy", "xid-storm", "tcp-only"];

pub async fn scripted_fleet(pg: &TestPg) -> CollectorProc {
    let c = CollectorProc::start_with(&pg.url(), &NODES, &[]);
    send(&c, "seed-auto", vec![topo_rec(topology(&fixture::seed_kvm_guest(), None))]).await;
    send(&c, "seed-auto", seed_probes(|g| format!("mlx5_{g}"), PairSelection::Predicted)).await;
    send(&c, "seed-pinned", vec![topo_rec(topology(&fixture::seed_kvm_guest(), Some("mlx5_0:1")))]).await;
    send(&c, "seed-pinned", seed_probes(|_| "mlx5_0".into(), PairSelection::Pinned)).await;
    // A healthy bare-metal node, and one timeout on GPU2's pair.
    let mut healthy = vec![topo_rec(topology(&fixture::dgx_h100_like(), None))];
    for g in 0..8u32 {
        for k in 0..6 {
            let v = if g == 2 && k == 3 { ProbeVerdict::Timeout } else { ProbeVerdict::Ok };
            healthy.push(probe_rec(g, &format!("mlx5_{g}"), v, PairSelection::Predicted, 300 - k * 30));
        }
    }
    send(&c, "healthy", healthy).await;
    // The same healthy node shape, with an Xid storm on GPU7.
    let mut storm = vec![topo_rec(topology(&fixture::dgx_h100_like(), None))];
    for g in 0..8u32 {
        storm.push(probe_rec(g, &format!("mlx5_{g}"), ProbeVerdict::Ok, PairSelection::Predicted, 30));
    }
    for i in 0..40 {
        let mut s = signal(i);
        s.gpu = Some(7);
        storm.push(
            Record {
                id: RecordId::random(),
                observed_at: Utc::now() - chrono::Duration::seconds(5),
                body: RecordBody::Signal(s),
            }
            .into(),
        );
    }
    send(&c, "xid-storm", storm).await;
    // A healthy node whose probes exercised no NIC (tcp): every probe verified, no GPU proven.
    let mut tcp = vec![topo_rec(topology(&fixture::dgx_h100_like(), None))];
    for g in 0..8u32 {
        let mut r = probe_rec(g, &format!("mlx5_{g}"), ProbeVerdict::Ok, PairSelection::Predicted, 30);
        if let Some(railguard_schema::wire::record::Body::Probe(p)) = r.body.as_mut() {
            p.transport = railguard_schema::wire::Transport::Tcp as i32;
            p.simulated = false;
            p.path = railguard_schema::wire::DataPath::HostCopy as i32;
        }
        tcp.push(r);
    }
    send(&c, "tcp-only", tcp).await;
    // Assessment runs every second; wait until every node's GPUs are assessed.
    wait::until_async("every node's 8 GPUs assessed", Duration::from_secs(60), async || {
        let short: Vec<&str> = NODES.iter().copied().filter(|n| statuses(&c, n).len() < 8).collect();
        if short.is_empty() { Ok(()) } else { Err(format!("{short:?} not yet")) }
    })
    .await;
    // One more pass begun after all of it: what the tests read is settled, nothing flaps.
    c.wait_for_a_later_pass();
    c
}

/// An agent's summary of `probes` ok probes of GPU `gpu` through `nic`, the last at `last_at`,
/// as the agent sends it: a set of one summary.
pub fn summary(gpu: u32, nic: &str, probes: u32, last_at: DateTime<Utc>) -> Record {
    let summaries = vec![pair_summary(gpu, nic, probes, last_at)];
    Record { id: RecordId::random(), observed_at: last_at, body: RecordBody::Summaries(ProbeSummarySet { summaries }) }
}

/// The summary of `probes` ok probes of GPU `gpu` through `nic`, the last at `last_at`.
pub fn pair_summary(gpu: u32, nic: &str, probes: u32, last_at: DateTime<Utc>) -> ProbeSummary {
    let p = probe(0);
    ProbeSummary {
        gpu,
        gpu_bdf: p.gpu_bdf,
        nic: nic.into(),
        nic_bdf: p.nic_bdf,
        transport: Transport::Sim,
        memory: Memory::Host,
        path: DataPath::Simulated,
        injected: Injected::None,
        simulated: true,
        selection: PairSelection::Predicted,
        lanes: vec![],
        probes,
        bytes: u64::from(probes) << 20,
        duration_min_ns: 1,
        duration_median_ns: 2,
        duration_max_ns: 3,
        first_at: last_at - chrono::TimeDelta::minutes(4),
        last_at,
    }
}

/// A silent corruption of GPU `gpu` through `nic` at `at`.
pub fn failure(gpu: u32, nic: &str, at: DateTime<Utc>) -> Record {
    let mut p = probe(3); // a silent corruption
    p.gpu = gpu;
    p.nic = nic.into();
    p.bytes = 1 << 20;
    Record { id: RecordId::random(), observed_at: at, body: RecordBody::Probe(p) }
}
