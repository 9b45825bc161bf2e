//! A pass reads the window's probe evidence in two parts (records stored a row each, grouped in
//! SQL; summary sets added up by the collector as rows of arrays, collector/src/assess/window.rs).
//! What it yields must be what one query over every record and summary (`probe_evidence`)
//! defines: the query the collector ran before, kept here as the reference, on random evidence
//! of every provenance (paths, memory, injected faults, transports and lanes, sets of one summary
//! and of many, evidence before the window), for the whole fleet and for a few nodes.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, SubsecRound, Utc};
use railguard_agent::topology::fixture;
use railguard_collector::assess::{AssessConfig, PairCounts};
use railguard_collector::evidence::load_inputs;
use railguard_collector::patterns;
use railguard_collector::patterns::{PeriodReads, RolledReads};
use railguard_collector::store::Store;
use railguard_e2e::scripted::*;
use railguard_e2e::*;
use railguard_schema::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The reference: per pair, the trust policy over `probe_evidence` in one query.
const REFERENCE_COUNTS: &str = "WITH w AS (
        SELECT * FROM probe_evidence
        WHERE observed_at > $2 AND observed_at <= $3 AND injected = 'none'
          AND ($1::text[] IS NULL OR node_id = ANY($1))
     ), sim AS (
        SELECT node_id, bool_and(path = 'simulated') AS all_simulated FROM w GROUP BY node_id
     ), t AS (
        SELECT w.*, railguard_standing(w.path, w.memory, sim.all_simulated) AS standing,
               railguard_standing(w.path, w.memory, sim.all_simulated) <> 'unproven' AS trusted
        FROM w JOIN sim USING (node_id)
     )
     SELECT node_id, gpu_index, nic,
            coalesce(sum(probes) FILTER (WHERE trusted AND verdict = 'ok'), 0),
            coalesce(sum(probes) FILTER (WHERE trusted AND verdict = 'silent_corruption'), 0),
            coalesce(sum(probes) FILTER (WHERE trusted AND verdict = 'reported_failure'), 0),
            coalesce(sum(probes) FILTER (WHERE trusted AND verdict = 'timeout'), 0),
            coalesce(sum(probes) FILTER (WHERE trusted AND verdict = 'ok' AND path = 'nic_dma' AND memory = 'cuda'), 0),
            coalesce(sum(probes) FILTER (WHERE standing = 'nic_gpu_memory'), 0),
            mode() WITHIN GROUP (ORDER BY diagnosis) FILTER (WHERE trusted AND verdict = 'silent_corruption'),
            coalesce(bool_or(trusted AND path = 'simulated'), false),
            coalesce(sum(probes) FILTER (WHERE NOT trusted AND verdict = 'ok'), 0),
            coalesce(sum(probes) FILTER (WHERE NOT trusted AND verdict <> 'ok'), 0),
            coalesce(array_agg(DISTINCT CASE WHEN jsonb_array_length(lanes) > 0
                                             THEN transport || ' over ' || (lanes->>0) ELSE transport END)
                     FILTER (WHERE NOT trusted), '{}')
     FROM t
     GROUP BY node_id, gpu_index, nic";

/// The reference for the hysteresis: the workload pair's ten latest records that could make its
/// GPU `ok`, newest first (the fixture's nodes have a GPUDirect path: GPU memory through the
/// pair's NIC, or the simulated fabric of an all-simulated node).
const REFERENCE_RECENT: &str = "WITH w AS (
        SELECT * FROM probe_evidence
        WHERE observed_at > $2 AND observed_at <= $3 AND injected = 'none'
          AND ($1::text[] IS NULL OR node_id = ANY($1))
     ), sim AS (
        SELECT node_id, bool_and(path = 'simulated') AS all_simulated FROM w GROUP BY node_id
     )
     SELECT node_id, gpu_index, verdict, probes FROM (
        SELECT e.node_id, e.gpu_index, e.verdict, e.probes,
               row_number() OVER (PARTITION BY e.node_id, e.gpu_index ORDER BY e.observed_at DESC) AS rn
        FROM w e JOIN sim USING (node_id)
        JOIN (SELECT node_id, (r->>'gpu')::int AS gpu_index, r->>'predicted_nic' AS nic
              FROM latest_topology, jsonb_array_elements(risks) r) wl
          ON wl.node_id = e.node_id AND wl.gpu_index = e.gpu_index AND wl.nic = e.nic
        WHERE railguard_standing(e.path, e.memory, sim.all_simulated) IN ('nic_gpu_memory', 'simulated')
     ) r WHERE rn <= 10 ORDER BY node_id, gpu_index, rn";

type Counts = (String, i32, String, i64, i64, i64, i64, i64, i64, Option<Diagnosis>, bool, i64, i64, Vec<String>);

async fn reference(
    pg: &TestPg,
    nodes: Option<&[String]>,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> (BTreeMap<(String, u32), Vec<PairCounts>>, BTreeMap<(String, u32), Vec<ProbeVerdict>>) {
    let filter: Option<Vec<String>> = nodes.map(<[String]>::to_vec);
    let rows: Vec<Counts> =
        sqlx::query_as(REFERENCE_COUNTS).bind(&filter).bind(since).bind(now).fetch_all(&pg.pool).await.unwrap();
    let mut pairs: BTreeMap<(String, u32), Vec<PairCounts>> = BTreeMap::new();
    let n = |v: i64| u32::try_from(v).unwrap();
    for (node, gpu, nic, ok, sc, rf, to, ok_gpu, gpu_memory, diagnosis, simulated, un_ok, un_bad, via) in rows {
        pairs.entry((node, u32::try_from(gpu).unwrap())).or_default().push(PairCounts {
            nic,
            ok: n(ok),
            silent_corruption: n(sc),
            reported_failure: n(rf),
            timeout: n(to),
            ok_gpu_memory: n(ok_gpu),
            gpu_memory: n(gpu_memory),
            diagnosis,
            simulated,
            unproven_ok: n(un_ok),
            unproven_bad: n(un_bad),
            unproven_via: via,
            inline: Default::default(),
        });
    }
    for v in pairs.values_mut() {
        v.sort_by(|a, b| a.nic.cmp(&b.nic));
    }
    let rows: Vec<(String, i32, ProbeVerdict, i32)> =
        sqlx::query_as(REFERENCE_RECENT).bind(&filter).bind(since).bind(now).fetch_all(&pg.pool).await.unwrap();
    let mut recent: BTreeMap<(String, u32), Vec<ProbeVerdict>> = BTreeMap::new();
    for (node, gpu, verdict, probes) in rows {
        let r = recent.entry((node, u32::try_from(gpu).unwrap())).or_default();
        let room = 10usize.saturating_sub(r.len());
        r.extend(std::iter::repeat_n(verdict, usize::try_from(probes).unwrap().clamp(1, room.max(1))));
        r.truncate(10);
    }
    (pairs, recent)
}

fn pick<T: Copy>(rng: &mut StdRng, of: &[T]) -> T {
    of[rng.random_range(0..of.len())]
}

/// Provenance as an agent would report it: the simulated fabric, or a real transport with its
/// path, memory and lanes.
fn provenance(rng: &mut StdRng, simulated_node: bool) -> (Transport, DataPath, Memory, Vec<String>) {
    if simulated_node || rng.random_bool(0.25) {
        // Simulated GPU memory too: only the pair's NIC moving GPU memory counts as verified in it.
        return (Transport::Sim, DataPath::Simulated, pick(rng, &[Memory::Host, Memory::Cuda]), Vec::new());
    }
    let transport = pick(rng, &[Transport::Ucx, Transport::Nixl, Transport::Verbs, Transport::Tcp]);
    let path = if transport == Transport::Tcp {
        DataPath::HostCopy
    } else {
        pick(rng, &[DataPath::NicDma, DataPath::HostCopy, DataPath::OtherDevice])
    };
    let memory = pick(rng, &[Memory::Host, Memory::Cuda, Memory::CudaStaged]);
    let lanes = match rng.random_range(0..4) {
        0 => Vec::new(),
        1 => vec!["tcp/lo".to_owned()],
        2 => vec!["rc_mlx5/mlx5_0:1".to_owned(), "rc_mlx5/mlx5_1:1".to_owned()],
        _ => vec!["sysv/memory".to_owned()],
    };
    (transport, path, memory, lanes)
}

fn injected(rng: &mut StdRng) -> Injected {
    if rng.random_bool(0.1) {
        pick(rng, &[Injected::Bitflip, Injected::Drop, Injected::DmaReadRejected])
    } else {
        Injected::None
    }
}

/// A node's random evidence: full probes (every verdict), sets of one summary and of many,
/// each at its own time (ties in time would leave the latest verdicts' order to chance), some
/// of it before the window.
fn evidence(rng: &mut StdRng, node: usize, now: DateTime<Utc>) -> Vec<Record> {
    // Distinct times across the node's records: millisecond `k` of the node's own offset.
    let mut k = 0i64;
    let mut at = |rng: &mut StdRng| {
        k += 1;
        let within = rng.random_bool(0.9);
        let secs = if within { rng.random_range(1..880) } else { rng.random_range(905..1500) };
        now - Duration::seconds(secs) - Duration::milliseconds(k * 10 + node as i64)
    };
    evidence_at(rng, node, (160, 6, 4), &mut at)
}

/// A node's random evidence as [`evidence`] makes it: `n.0` full probes, `n.1` sets of one
/// summary and `n.2` sets of many, each at the time `at` picks.
fn evidence_at(
    rng: &mut StdRng,
    node: usize,
    n: (usize, usize, usize),
    at: &mut dyn FnMut(&mut StdRng) -> DateTime<Utc>,
) -> Vec<Record> {
    // Nodes 0-3: every record the simulated fabric's (trusted there; node 3's injected faults on
    // a real transport, which are no evidence, leave it so); nodes 4-5: simulated records stored
    // a row each, summary sets of every kind; the rest mixed throughout (the simulated fabric's probes are
    // unproven there, as host copies always are).
    let (simulated_probes, simulated_summaries) = (node < 6, node < 4);
    let mut out = Vec::new();
    for _ in 0..n.0 {
        let mut p = probe(0);
        p.gpu = rng.random_range(0..8);
        // The workload pair (the fixture's PIX NIC, mlx5_<gpu>) half of the time.
        p.nic =
            if rng.random_bool(0.5) { format!("mlx5_{}", p.gpu) } else { format!("mlx5_{}", rng.random_range(0..8)) };
        (p.transport, p.path, p.memory, p.lanes) = provenance(rng, simulated_probes);
        p.injected = injected(rng);
        if node == 3 && p.injected != Injected::None {
            (p.transport, p.path) = (Transport::Ucx, DataPath::NicDma);
        }
        p.simulated = p.path == DataPath::Simulated;
        p.verdict = pick(
            rng,
            &[
                ProbeVerdict::Ok,
                ProbeVerdict::Ok,
                ProbeVerdict::SilentCorruption,
                ProbeVerdict::ReportedFailure,
                ProbeVerdict::Timeout,
            ],
        );
        p.diagnosis = match p.verdict {
            ProbeVerdict::SilentCorruption => {
                pick(rng, &[Diagnosis::Untouched, Diagnosis::Stale, Diagnosis::Corrupt, Diagnosis::Misdirected])
            }
            ProbeVerdict::Timeout => Diagnosis::Untouched,
            _ => Diagnosis::None,
        };
        out.push(Record { id: RecordId::random(), observed_at: at(rng), body: RecordBody::Probe(p) });
    }
    let summary = |rng: &mut StdRng, gpu: u32, nic: String, last_at: DateTime<Utc>, simulated: bool| {
        let (transport, path, memory, lanes) = provenance(rng, simulated);
        ProbeSummary {
            gpu,
            gpu_bdf: None,
            nic,
            nic_bdf: None,
            transport,
            memory,
            path,
            injected: injected(rng),
            simulated: path == DataPath::Simulated,
            selection: PairSelection::Sweep,
            lanes,
            probes: rng.random_range(1..12),
            bytes: 1 << 20,
            duration_min_ns: 1,
            duration_median_ns: 2,
            duration_max_ns: 3,
            first_at: last_at - Duration::seconds(250),
            last_at,
        }
    };
    for _ in 0..n.1 {
        let last_at = at(rng);
        let (gpu, nic) = (rng.random_range(0..8), format!("mlx5_{}", rng.random_range(0..8)));
        let s = summary(rng, gpu, nic, last_at, simulated_probes);
        let set = ProbeSummarySet { summaries: vec![s] };
        out.push(Record { id: RecordId::random(), observed_at: last_at, body: RecordBody::Summaries(set) });
    }
    for _ in 0..n.2 {
        let last_at = at(rng);
        let mut summaries = Vec::new();
        for gpu in 0..8u32 {
            for nic in 0..8u32 {
                if rng.random_bool(0.6) {
                    // Each summary's last probe at most a window before the set's.
                    let own = last_at - Duration::seconds(rng.random_range(0..200));
                    summaries.push(summary(rng, gpu, format!("mlx5_{nic}"), own, simulated_summaries));
                }
            }
        }
        if let Some(first) = summaries.first_mut() {
            first.last_at = last_at;
        }
        out.push(Record {
            id: RecordId::random(),
            observed_at: last_at,
            body: RecordBody::Summaries(ProbeSummarySet { summaries }),
        });
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pass_reads_the_window_as_one_query_over_every_record_would() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let window = AssessConfig::default().window;
    let now = Utc::now().trunc_subsecs(6);
    let since = now - Duration::from_std(window).unwrap();
    let mut rng = StdRng::seed_from_u64(15);
    let names: Vec<String> = (0..10).map(|i| format!("node-{i:02}")).collect();
    for (i, n) in names.iter().enumerate() {
        let node = NodeId::new(n.clone()).unwrap();
        store.register_node(&node, n, "test").await.unwrap();
        let mut records = vec![Record::try_from(topo_rec(topology(&fixture::dgx_h100_like(), None))).unwrap()];
        records.extend(evidence(&mut rng, i, now));
        store.ingest(&node, records, 0).await.unwrap();
    }
    let sets: i64 = pg.count("probe_summary_sets").await;
    assert_eq!(sets, 100, "every node's sets stored (6 of one summary, 4 of many, a node)");

    for nodes in [None, Some(&names[2..7])] {
        let (want_pairs, want_recent) = reference(&pg, nodes, since, now).await;
        let inputs = load_inputs(&pg.pool, nodes, now, window).await.unwrap().gpus;
        let got_pairs: BTreeMap<(String, u32), Vec<PairCounts>> = inputs
            .iter()
            .filter(|(_, i)| !i.pairs.is_empty())
            .map(|(k, i)| ((k.node.clone(), k.gpu), i.pairs.clone()))
            .collect();
        let got_recent: BTreeMap<(String, u32), Vec<ProbeVerdict>> = inputs
            .iter()
            .filter(|(_, i)| !i.workload_recent.is_empty())
            .map(|(k, i)| ((k.node.clone(), k.gpu), i.workload_recent.clone()))
            .collect();
        // The evidence exercised what it should: trusted and unproven counts, mixed diagnoses,
        // simulated pairs trusted on simulated nodes only, lanes in the unproven transports.
        let all: Vec<&PairCounts> = want_pairs.values().flatten().collect();
        assert!(all.iter().any(|p| p.unproven_ok > 0 && p.unproven_bad > 0));
        assert!(all.iter().any(|p| p.ok_gpu_memory > 0));
        assert!(all.iter().any(|p| p.simulated) && all.iter().any(|p| !p.simulated && p.ok > 0));
        assert!(all.iter().any(|p| p.unproven_via.iter().any(|v| v.contains(" over "))));
        assert!(all.iter().any(|p| p.unproven_via.len() > 1));
        assert!(all.iter().any(|p| p.diagnosis.is_some_and(|d| d != Diagnosis::Untouched)));
        assert!(
            want_recent
                .values()
                .any(|r| r.len() == 10 && r.contains(&ProbeVerdict::Ok) && r.iter().any(|v| *v != ProbeVerdict::Ok))
        );
        assert_eq!(got_pairs.len(), want_pairs.len(), "the GPUs with evidence ({nodes:?})");
        for (k, want) in &want_pairs {
            assert_eq!(got_pairs.get(k), Some(want), "pairs of {k:?}");
        }
        assert_eq!(got_recent, want_recent, "the workload pairs' latest verdicts ({nodes:?})");
        if let Some(nodes) = nodes {
            assert!(inputs.keys().all(|k| nodes.contains(&k.node)), "only the nodes asked for");
        }
    }
}

/// The pattern finder's read before its pairs were counted as a pass counts them and their
/// facts kept between reads: one query joining every pair to its node's latest snapshot, GPU
/// and path. The reference for `patterns::load`.
const REFERENCE_PATTERN_PAIRS: &str = "WITH w AS (
        SELECT node_id, gpu_index, nic, verdict, path FROM probe_evidence
        WHERE observed_at > $1 AND observed_at <= $2 AND injected = 'none'
     ), sim AS (
        SELECT node_id, bool_and(path = 'simulated') AS all_simulated FROM w GROUP BY node_id
     ), probes AS (
        SELECT w.node_id, w.gpu_index, w.nic, bool_or(w.verdict <> 'ok') AS failed, bool_or(w.path = 'simulated') AS simulated
        FROM w JOIN sim USING (node_id)
        WHERE railguard_trusted(w.path, sim.all_simulated)
        GROUP BY 1, 2, 3
     ), inline AS (
        SELECT node_id, gpu_index, nic, sum(transfers_mismatch - transfers_mismatch_misplaced) > 0 AS failed,
               false AS simulated
        FROM inline_reports
        WHERE observed_at > $1 AND observed_at <= $2 AND gpu_index IS NOT NULL AND nic <> '' AND path = 'nic_dma'
          AND NOT simulated
        GROUP BY 1, 2, 3
     ), pairs AS (
        SELECT node_id, gpu_index, nic, bool_or(failed) AS failed, bool_or(simulated) AS simulated
        FROM (SELECT * FROM probes UNION ALL SELECT * FROM inline) x GROUP BY 1, 2, 3
     )
     SELECT p.node_id, p.gpu_index, p.nic, p.failed, p.simulated, tp.class, s.virtualized, s.hypervisor, s.viommu,
            s.gpudirect, s.driver_version, tg.name AS gpu_model,
            (SELECT r->>'predicted_nic' = p.nic FROM jsonb_array_elements(s.risks) r
             WHERE (r->>'gpu')::int = p.gpu_index LIMIT 1) AS workload_pair
     FROM pairs p
     LEFT JOIN latest_topology s ON s.node_id = p.node_id
     LEFT JOIN topology_paths tp ON tp.node_id = s.node_id AND tp.snapshot_id = s.record_id AND tp.a = 'GPU' || p.gpu_index AND tp.b = p.nic
     LEFT JOIN topology_gpus tg ON tg.node_id = s.node_id AND tg.snapshot_id = s.record_id AND tg.gpu_index = p.gpu_index";

type PatternRow = (
    String,
    i32,
    String,
    bool,
    bool,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<bool>,
);

async fn reference_patterns(pg: &TestPg, since: DateTime<Utc>, until: DateTime<Utc>) -> Vec<patterns::PairFacts> {
    let rows: Vec<PatternRow> =
        sqlx::query_as(REFERENCE_PATTERN_PAIRS).bind(since).bind(until).fetch_all(&pg.pool).await.unwrap();
    rows.into_iter()
        .map(|(node, gpu, nic, failed, simulated, class, virt, hv, viommu, gd, driver, model, wl)| {
            let mut attrs = BTreeMap::new();
            let mut put = |k: &'static str, v: Option<String>| {
                if let Some(v) = v {
                    attrs.insert(k, v);
                }
            };
            put("path", class);
            put("virtualized", virt);
            put("hypervisor", hv.map(|h| h.to_lowercase()));
            put("viommu", viommu);
            put("gpudirect", gd);
            put("driver", driver);
            put("gpu_model", model.filter(|m| !m.is_empty()));
            put("workload_pair", wl.map(|w| if w { "yes" } else { "no" }.to_owned()));
            put("node", Some(node.clone()));
            patterns::PairFacts { node, gpu, nic, failed, simulated, attrs }
        })
        .collect()
}

fn inline_report(rng: &mut StdRng, at: DateTime<Utc>) -> Record {
    let gpu = rng.random_range(0..8);
    let mismatch = rng.random_bool(0.3);
    Record {
        id: RecordId::random(),
        observed_at: at,
        body: RecordBody::Inline(InlineReport {
            gpu: Some(gpu),
            gpu_bdf: None,
            nic: if rng.random_bool(0.1) { String::new() } else { format!("mlx5_{}", rng.random_range(0..8)) },
            nic_bdf: None,
            pid: 7,
            process: "vllm".into(),
            memory: pick(rng, &[Memory::Cuda, Memory::Host]),
            path: pick(rng, &[DataPath::NicDma, DataPath::HostCopy]),
            attribution: "test".into(),
            transfers_ok: 4,
            transfers_mismatch: u64::from(mismatch),
            transfers_error: 0,
            bytes_verified: 1 << 20,
            blocks_verified: 16,
            first_at: at - Duration::seconds(5),
            last_at: at,
            failures: Vec::new(),
            failures_omitted: 0,
            transfers_mismatch_misplaced: 0,
            simulated: false,
            engine: None,
            sources_changed: 0,
            pod: None,
        }),
    }
}

/// The pattern finder counts each pair as a pass does and keeps every node's topology facts
/// between reads; what it groups must be what one query joining every pair to its node's latest
/// snapshot found (the read before, kept above), on random evidence of every provenance, nodes
/// of several topologies (a pinned one, one that never sent any), in-line reports, and after a
/// node's topology changed.
#[tokio::test(flavor = "multi_thread")]
async fn the_pattern_finder_groups_the_pairs_one_joining_query_found() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let now = Utc::now().trunc_subsecs(6);
    let since = now - Duration::minutes(15);
    let mut rng = StdRng::seed_from_u64(17);
    let names: Vec<String> = (0..12).map(|i| format!("node-{i:02}")).collect();
    for (i, n) in names.iter().enumerate() {
        let node = NodeId::new(n.clone()).unwrap();
        store.register_node(&node, n, "test").await.unwrap();
        let mut records = Vec::new();
        let spec = match i % 4 {
            0 => fixture::seed_kvm_guest(),
            1 => fixture::dgx_h100_like(),
            2 => fixture::flat_cloud_vm(),
            _ => fixture::two_socket_translating(),
        };
        if i != 11 {
            let mut t = topology(&spec, (i == 5).then_some("mlx5_2:1"));
            // GPU models as NVML names them, on some nodes (none on the rest: unknown).
            for g in t.gpus.iter_mut().filter(|_| i % 3 == 0) {
                g.name = if g.index < 4 { "NVIDIA H200".into() } else { "NVIDIA H100 80GB HBM3".into() };
            }
            records.push(Record::try_from(topo_rec(t)).unwrap());
        }
        records.extend(evidence(&mut rng, i, now));
        for k in 0..3 {
            records.push(inline_report(&mut rng, now - Duration::seconds(30 + k)));
        }
        store.ingest(&node, records, 0).await.unwrap();
    }
    let facts = patterns::Facts::default();
    let check = |got: patterns::Pairs, want: Vec<patterns::PairFacts>, when: &str| {
        let want = patterns::Pairs::of(&want);
        assert_eq!((got.pairs, got.failing), (want.pairs, want.failing), "{when}");
        assert_eq!(got.counts(), want.counts(), "{when}");
        assert_eq!(got.explain(), want.explain(), "{when}");
        got
    };
    let first = check(
        patterns::load(&pg.pool, &facts, since, now).await.unwrap(),
        reference_patterns(&pg, since, now).await,
        "the first read",
    );
    // The evidence exercised what it should: failing and healthy pairs, several path classes and
    // hosts, workload pairs and not, simulated failures, pairs of the node without a topology.
    let counts = first.counts();
    let has = |a: &str| counts.keys().any(|k| k.iter().any(|(x, _)| *x == a));
    assert!(first.failing > 0 && first.failing < first.pairs, "{} of {}", first.failing, first.pairs);
    for a in ["path", "hypervisor", "gpu_model", "workload_pair"] {
        assert!(has(a), "{a}: {:?}", counts.keys().next());
    }
    assert!(counts.keys().any(|k| k.len() == 1 && k[0].1 == "node-11"), "the node without a topology");
    assert!(counts.values().any(|c| c.2 > 0), "failures on the simulated fabric");
    let paths: std::collections::BTreeSet<&str> =
        counts.keys().flat_map(|k| k.iter().filter(|(a, _)| *a == "path").map(|(_, v)| v.as_str())).collect();
    assert!(paths.len() >= 3, "{paths:?}");
    assert_eq!(facts.len(), 11, "every node with a topology is kept");
    let fetched = facts.fetched();
    assert_eq!(fetched, 11);

    // Read again: the same, and no snapshot fetched again.
    check(
        patterns::load(&pg.pool, &facts, since, now).await.unwrap(),
        reference_patterns(&pg, since, now).await,
        "again",
    );
    assert_eq!(facts.fetched(), fetched);

    // A node's topology changes (another machine, a pin): its facts are read again, only its.
    for (i, pin) in [(1, Some("mlx5_6:1")), (2, None)] {
        let spec = if i == 1 { fixture::dgx_h100_like() } else { fixture::seed_kvm_guest() };
        let topo = Record::try_from(topo_rec(topology(&spec, pin))).unwrap();
        store.ingest(&NodeId::new(names[i].clone()).unwrap(), vec![topo], 0).await.unwrap();
    }
    check(
        patterns::load(&pg.pool, &facts, since, now).await.unwrap(),
        reference_patterns(&pg, since, now).await,
        "after two nodes' topology changed",
    );
    assert_eq!(facts.fetched(), fetched + 2);
}

/// Across the storage tiers: over a period of hours, the hours the collector rolled up are read
/// from the pair-hour rollups, and the pattern finder finds what the joining query found over
/// the evidence itself, even once that evidence is gone (the summaries' retention is shorter
/// than the rollups').
#[tokio::test(flavor = "multi_thread")]
async fn the_pattern_finder_reads_rolled_hours_from_the_rollups() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let now = Utc::now().trunc_subsecs(6);
    let since = now - Duration::hours(5);
    let mut rng = StdRng::seed_from_u64(18);
    let names: Vec<String> = (0..8).map(|i| format!("node-{i:02}")).collect();
    for (i, n) in names.iter().enumerate() {
        let node = NodeId::new(n.clone()).unwrap();
        store.register_node(&node, n, "test").await.unwrap();
        let spec = if i % 2 == 0 { fixture::seed_kvm_guest() } else { fixture::dgx_h100_like() };
        let mut records = vec![Record::try_from(topo_rec(topology(&spec, None))).unwrap()];
        let mut k = 0i64;
        records.extend(evidence_at(&mut rng, i, (120, 4, 6), &mut |rng| {
            k += 1;
            now - Duration::seconds(rng.random_range(1..5 * 3600)) - Duration::milliseconds(k * 10 + i as i64)
        }));
        store.ingest(&node, records, 0).await.unwrap();
    }
    // A node that probes the same pairs through their NICs every hour (its rollup rows share
    // one layout, which the read adds up row after row), one of them failing in one hour only.
    let steady = NodeId::new("node-08".to_owned()).unwrap();
    store.register_node(&steady, "node-08", "test").await.unwrap();
    let mut records = vec![Record::try_from(topo_rec(topology(&fixture::dgx_h100_like(), None))).unwrap()];
    for h in 0..4i64 {
        for gpu in 0..4 {
            let at = now - Duration::seconds(h * 3600 + 1800 + i64::from(gpu));
            records.push(nic_probe(gpu, gpu == 2 && h == 1, at));
        }
    }
    store.ingest(&steady, records, 0).await.unwrap();
    let want = reference_patterns(&pg, since, now).await;
    assert!(want.iter().any(|p| p.node == "node-08" && p.gpu == 2 && p.failed), "node-08's GPU2 fails in the period");
    let facts = patterns::Facts::default();
    let check = |got: patterns::Pairs, when: &str| {
        let want = patterns::Pairs::of(&want);
        assert!(want.failing > 0 && want.failing < want.pairs);
        assert_eq!((got.pairs, got.failing), (want.pairs, want.failing), "{when}");
        assert_eq!(got.counts(), want.counts(), "{when}");
        assert_eq!(got.explain(), want.explain(), "{when}");
    };
    check(patterns::load(&pg.pool, &facts, since, now).await.unwrap(), "nothing rolled up");

    // The collector rolls up every passed hour; the whole hours of the period come from there.
    let (pass, until) = store.roll_up_passed(None, now).await.unwrap();
    // Every whole hour of the period at least (four; a fifth, the hour `since` falls in, only
    // when some random evidence falls after `since` in it, which a `now` late in its hour leaves
    // to chance).
    let whole = (railguard_collector::store::rollup::hour_of(now)
        - railguard_collector::store::rollup::hour_of(since)
        - Duration::hours(1))
    .num_hours();
    assert_eq!(whole, 4);
    assert!(i64::from(pass.hours) >= whole && pass.rows > 0, "{pass:?}");
    assert_eq!(until, railguard_collector::store::rollup::hour_of(now));
    let rolled: i64 = pg.count("rollup_hours").await;
    assert_eq!(rolled, i64::from(pass.hours));
    check(patterns::load(&pg.pool, &facts, since, now).await.unwrap(), "rolled up");

    // The evidence of the rolled hours inside the period goes (as retention would drop it):
    // the rollups answer for it.
    let first = railguard_collector::store::rollup::hour_of(since) + Duration::hours(1);
    for (table, delete) in [
        ("probe_results", "DELETE FROM probe_results WHERE observed_at >= $1 AND observed_at < $2"),
        ("probe_summary_sets", "DELETE FROM probe_summary_sets WHERE observed_at >= $1 AND observed_at < $2"),
    ] {
        let gone = sqlx::query(delete).bind(first).bind(until).execute(&pg.pool).await.unwrap().rows_affected();
        assert!(gone > 0, "{table}");
    }
    check(patterns::load(&pg.pool, &facts, since, now).await.unwrap(), "the rolled hours' evidence gone");
    // Without the rollups marked, the same read finds less (the evidence is gone): the hours did
    // come from the rollups.
    sqlx::query("DELETE FROM rollup_hours").execute(&pg.pool).await.unwrap();
    let without = patterns::load(&pg.pool, &facts, since, now).await.unwrap();
    assert!(without.counts() != patterns::Pairs::of(&want).counts(), "the rollups answered for the hours");
}

/// A probe of `node-08`'s kind: through the pair's own NIC (trusted), ok unless `bad`.
fn nic_probe(gpu: u32, bad: bool, at: DateTime<Utc>) -> Record {
    let mut p = probe(0);
    (p.gpu, p.nic) = (gpu, format!("mlx5_{gpu}"));
    (p.transport, p.path, p.simulated) = (Transport::Ucx, DataPath::NicDma, false);
    p.lanes = vec![format!("rc_verbs/mlx5_{gpu}:1")];
    p.verdict = if bad { ProbeVerdict::SilentCorruption } else { ProbeVerdict::Ok };
    p.diagnosis = if bad { Diagnosis::Corrupt } else { Diagnosis::None };
    Record { id: RecordId::random(), observed_at: at, body: RecordBody::Probe(p) }
}

/// The pattern finder's kept periods (`PeriodCache`): read after read of relative periods (the
/// dashboard's 15 minutes, another length beside it), with evidence arriving between reads and
/// leaving the periods, evidence stored late inside the part already kept (a failure on a node
/// otherwise healthy: marked by ingest, the node read again in full), a period that moves back
/// (read whole) and one shorter than what is read each time anyway, each read finds what the
/// joining query over the whole period finds.
#[tokio::test(flavor = "multi_thread")]
async fn the_pattern_finders_kept_periods_are_the_periods_read_whole_read_after_read() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let t0 = Utc::now().trunc_subsecs(3);
    let mut rng = StdRng::seed_from_u64(19);
    // node-08 and node-09 only ever send ok probes through their own NICs (one per GPU each
    // step), except node-08's failures stored late and one failure of node-09's that the
    // 15 minutes leave behind.
    let names: Vec<String> = (0..10).map(|i| format!("node-{i:02}")).collect();
    let healthy = 8;
    let mut used: Vec<std::collections::HashSet<i64>> = vec![Default::default(); names.len()];
    let mut pick = |rng: &mut StdRng, node: usize, from: DateTime<Utc>, to: DateTime<Utc>| loop {
        let ms = rng.random_range(0..(to - from).num_milliseconds());
        let t = to - Duration::milliseconds(ms);
        if used[node].insert(t.timestamp_millis()) {
            return t;
        }
    };
    let mut steady = |rng: &mut StdRng, i: usize, from: DateTime<Utc>, to: DateTime<Utc>, n| -> Vec<Record> {
        if i >= healthy {
            (0..8).map(|gpu| nic_probe(gpu, false, pick(rng, i, from, to))).collect()
        } else {
            evidence_at(rng, i, n, &mut |rng| pick(rng, i, from, to))
        }
    };
    for (i, n) in names.iter().enumerate() {
        let node = NodeId::new(n.clone()).unwrap();
        store.register_node(&node, n, "test").await.unwrap();
        let spec = if i % 2 == 0 { fixture::seed_kvm_guest() } else { fixture::dgx_h100_like() };
        let mut records = vec![Record::try_from(topo_rec(topology(&spec, None))).unwrap()];
        records.extend(steady(&mut rng, i, t0 - Duration::seconds(1500), t0, (120, 4, 4)));
        if i == healthy + 1 {
            records.push(nic_probe(3, true, t0 - Duration::seconds(600)));
        }
        store.ingest(&node, records, 0).await.unwrap();
    }
    // The history above stands in for what was stored long before these reads: its marks of
    // late evidence are old, so a read re-reads only the nodes stored late during the test
    // (node-09 never: its failure must leave the kept 15 minutes by moving them).
    sqlx::query("UPDATE nodes SET late_stored_at = late_stored_at - interval '1 hour'")
        .execute(&pg.pool)
        .await
        .unwrap();

    let facts = patterns::Facts::default();
    let failing_of =
        |pairs: &[patterns::PairFacts], node: &str| pairs.iter().filter(|p| p.node == node && p.failed).count();
    let (mut late, mut flipped, mut before, mut expired) = (0, 0, 0, None);
    for k in 0..=24i64 {
        // The periods run ahead of the clock, so what the nodes observe between reads is
        // stored before its time (never late).
        let now = t0 + Duration::seconds(40 * k);
        if k > 0 {
            for (i, n) in names.iter().enumerate() {
                if i != healthy && rng.random_bool(0.3) {
                    continue;
                }
                let records = steady(&mut rng, i, now - Duration::seconds(40), now, (12, 1, 1));
                store.ingest(&NodeId::new(n.clone()).unwrap(), records, 0).await.unwrap();
            }
        }
        if k % 6 == 5 {
            // Stored long after it was observed, inside the part of the 15 minutes already kept:
            // a failure of node-08's, and a random node's evidence.
            let real = Utc::now();
            let at = real - Duration::seconds(150) - Duration::milliseconds(k);
            let bad = nic_probe(u32::try_from(k % 8).unwrap(), true, at);
            store.ingest(&NodeId::new(names[healthy].clone()).unwrap(), vec![bad], 0).await.unwrap();
            let i = rng.random_range(0..healthy);
            let records = steady(&mut rng, i, real - Duration::seconds(200), real - Duration::seconds(100), (6, 0, 1));
            store.ingest(&NodeId::new(names[i].clone()).unwrap(), records, 0).await.unwrap();
            late += 1;
        }
        // Mostly the dashboard's 15 minutes; now and then 20 minutes (a second kept period), a
        // 15 minutes ending 5 minutes back (it moves back: read whole), and 90 s (shorter than
        // what is read each time: nothing kept).
        let (length, until) = match k {
            13 => (Duration::minutes(15), now - Duration::minutes(5)),
            _ if k % 5 == 4 => (Duration::minutes(20), now),
            7 => (Duration::seconds(90), now),
            _ => (Duration::minutes(15), now),
        };
        let since = until - length;
        let got = patterns::load(&pg.pool, &facts, since, until).await.unwrap();
        let want = reference_patterns(&pg, since, until).await;
        if length == Duration::minutes(15) && until == now {
            let failing = failing_of(&want, "node-08");
            if failing > before {
                flipped += 1;
            }
            before = failing;
            expired = match (expired, failing_of(&want, "node-09")) {
                (_, 1) => Some(false),
                (Some(false), 0) => Some(true),
                (e, _) => e,
            };
        }
        let want = patterns::Pairs::of(&want);
        assert_eq!((got.pairs, got.failing), (want.pairs, want.failing), "read {k}");
        assert_eq!(got.counts(), want.counts(), "read {k}");
        assert_eq!(got.explain(), want.explain(), "read {k}");
    }
    // The late failures mattered (each turned a pair of the healthy node failing where the
    // kept period had it ok), and most reads moved a kept period rather than reading it whole.
    assert!(late == 4 && flipped >= 2, "{late} late, {flipped} flipped");
    assert_eq!(expired, Some(true), "node-09's failure was in the 15 minutes, then left them");
    let PeriodReads { moved, whole, late_nodes: again } = facts.periods_answered();
    assert!(moved >= 15 && whole <= 4 && again >= 3, "{moved} moved, {whole} whole, {again} nodes read again");
}

/// The pattern finder's kept rolled-up hours (`RolledCache`): read after read of periods with
/// rolled hours in them (12 hours, 6 hours beside it, 20 hours now and then: three lengths, two
/// kept), moving hour by hour over 30 hours of rolled-up evidence, each read finds what the
/// joining query over the whole period finds, while hours leave the kept sum (a failure and a
/// pair that only they held), enter it, are rolled again where it is kept (a backfill: the
/// read is whole), are rolled again where a pass may still roll them (read each time, never
/// kept), lose their mark (retention), and the leader rolls a new hour (the settled hours move).
#[tokio::test(flavor = "multi_thread")]
async fn the_pattern_finders_kept_rolled_hours_are_the_periods_read_whole_read_after_read() {
    use railguard_collector::store::rollup::hour_of;
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let now = Utc::now().trunc_subsecs(6);
    let top = hour_of(now);
    let h = Duration::hours;
    let mut rng = StdRng::seed_from_u64(20);
    let names: Vec<String> = (0..10).map(|i| format!("node-{i:02}")).collect();
    for (i, n) in names.iter().enumerate() {
        let node = NodeId::new(n.clone()).unwrap();
        store.register_node(&node, n, "test").await.unwrap();
        let spec = if i % 2 == 0 { fixture::seed_kvm_guest() } else { fixture::dgx_h100_like() };
        let mut records = vec![Record::try_from(topo_rec(topology(&spec, None))).unwrap()];
        if i < 8 {
            let mut k = 0i64;
            records.extend(evidence_at(&mut rng, i, (240, 6, 30), &mut |rng| {
                k += 1;
                now - Duration::seconds(rng.random_range(1..30 * 3600)) - Duration::milliseconds(k * 10 + i as i64)
            }));
        } else {
            // node-08 probes GPUs 0-3 through their own NICs every hour, GPU2 failing in the
            // hour 19 hours back only; node-09 the same, and GPU7 in the hour 18 back only.
            for back in 1..=30i64 {
                for gpu in 0..4 {
                    let at = top - h(back) + Duration::seconds(1200 + i64::from(gpu));
                    records.push(nic_probe(gpu, i == 8 && gpu == 2 && back == 19, at));
                }
                if i == 9 && back == 18 {
                    records.push(nic_probe(7, false, top - h(back) + Duration::seconds(1300)));
                }
            }
        }
        store.ingest(&node, records, 0).await.unwrap();
    }
    // Every hour rolled up but the last one passed (the leader rolls that one during the reads).
    let (pass, _) = store.roll_up_passed(None, now - h(1)).await.unwrap();
    assert!(pass.hours >= 29, "{pass:?}");

    let facts = patterns::Facts::default();
    let node = |n: usize| NodeId::new(names[n].clone()).unwrap();
    let failing = |pairs: &[patterns::PairFacts], n: &str, gpu: i32| {
        pairs.iter().any(|p| p.node == n && p.gpu == gpu && p.failed)
    };
    let (mut left, mut backfilled, mut rerolled) = (false, false, false);
    for k in 0..=20i64 {
        let until = top - h(10) + Duration::minutes(30 * k + 7);
        match k {
            // Stored late into an hour the 12-hour sum keeps, and that hour rolled again (a
            // backfill): the next read is whole (the hour's mark changed) and sees it.
            4 => {
                let at = top - h(14) + Duration::seconds(1500);
                store.ingest(&node(9), vec![nic_probe(5, true, at)], 0).await.unwrap();
                store.roll_up_hour(top - h(14)).await.unwrap();
            }
            // Retention forgets a kept hour's mark: the period's rolled hours split around it,
            // and the next read is whole.
            9 => {
                sqlx::query("DELETE FROM rollup_hours WHERE hour = $1")
                    .bind(top - h(17))
                    .execute(&pg.pool)
                    .await
                    .unwrap();
            }
            // The leader rolls the hour that passed: the hours a pass may roll again move on.
            12 => {
                store.roll_up_hour(top - h(1)).await.unwrap();
            }
            // A failure stored into an hour a pass may still roll, and the leader's pass rolling
            // its three hours again: they were never kept, so the kept sum moves on.
            17 => {
                let at = top - h(2) + Duration::seconds(1500);
                store.ingest(&node(9), vec![nic_probe(6, true, at)], 0).await.unwrap();
                let (pass, _) = store.roll_up_passed(Some(top - h(3)), now).await.unwrap();
                assert_eq!(pass.hours, 3, "{pass:?}");
            }
            _ => {}
        }
        let mut lengths = vec![(h(12), until), (h(6), until)];
        if k == 2 || k == 12 {
            lengths.push((h(20), until));
        }
        if k == 10 {
            // A 12-hour period four hours back (the kept sum moves back, then forth).
            lengths.push((h(12), until - h(4)));
        }
        for (n, (length, until)) in lengths.into_iter().enumerate() {
            let since = until - length;
            let before = facts.rolled_answered();
            let got = patterns::load(&pg.pool, &facts, since, until).await.unwrap();
            let want = reference_patterns(&pg, since, until).await;
            let when = format!("read {k}, {}-h period to {until}", length.num_hours());
            if n == 0 {
                // node-08's failure (19 hours back, 20 minutes into the hour) is in the 12 hours
                // until they start after it.
                let holds = since < top - h(19) + Duration::seconds(1202);
                assert_eq!(failing(&want, "node-08", 2), holds, "{when}");
                left |= !holds;
                backfilled |= k >= 4 && failing(&want, "node-09", 5);
                rerolled |= k >= 17 && failing(&want, "node-09", 6);
            }
            let want = patterns::Pairs::of(&want);
            assert!(want.pairs > 0, "{when}");
            assert_eq!((got.pairs, got.failing), (want.pairs, want.failing), "{when}");
            assert_eq!(got.counts(), want.counts(), "{when}");
            assert_eq!(got.explain(), want.explain(), "{when}");
            let after = facts.rolled_answered();
            let (moved, whole, hours) =
                (after.moved - before.moved, after.whole - before.whole, after.hours_read - before.hours_read);
            assert_eq!(moved + whole, 1, "{when}: one read through the kept hours");
            if n == 0 {
                match k {
                    // The first: all its rolled hours.
                    0 => assert_eq!((whole, hours), (1, 11), "{when}"),
                    // The same hours again: none read (none a pass may roll again in it).
                    1 => assert_eq!((moved, hours), (1, 0), "{when}"),
                    // An hour on (the 20 hours then took the 12 hours' place: three lengths, two kept).
                    2 => assert_eq!((moved, hours), (1, 2), "{when}"),
                    3 => assert_eq!(whole, 1, "{when}"),
                    4 | 9 => assert_eq!(whole, 1, "{when}"),
                    5..=8 => assert_eq!(moved, 1, "{when}"),
                    // The three hours rolled again were never kept: the one of them in the period
                    // read, as each read reads it.
                    17 => assert_eq!((moved, hours), (1, 1), "{when}"),
                    _ => {}
                }
            }
        }
    }
    assert!(left && backfilled && rerolled, "left {left}, backfilled {backfilled}, rerolled {rerolled}");
    let RolledReads { moved, whole, .. } = facts.rolled_answered();
    assert!(moved >= 30 && whole <= 12, "{moved} moved, {whole} whole");
}
