//! Naming the culprit, on the collector binary and real Postgres, records as agents send them:
//! every finding names the layer its evidence implicates, and only the hardware of a GPU's own
//! path marks it.
//!
//! - an in-line mismatch moved by a host copy is the engine's: the GPU is not `corrupting`, has
//!   no pin, and the engine is named fleet-wide (API and /metrics); so is one moved by the GPU's
//!   NIC whose every block holds the source's bytes rearranged (`layout`: the engine rewrote them
//!   after arrival), and it blames no source either;
//! - mismatches on four decode GPUs of two nodes, through their own NICs, all from one source
//!   that sent wrong bytes to no other destination are the other end's, naming that source; a
//!   GPU with wrong bytes from a source of its own is its own path's (`corrupting`);
//!   the source is named fleet-wide (API, /metrics, `report`);
//! - a simulated device's in-line mismatches, moved by a real NIC's DMA, are marked as
//!   simulation, and its clean transfers prove nothing of the GPU;
//! - a node that sent no topology has no `ok` GPU (`unknown`, with the reason);
//! - a node whose evidence is all simulated is not `Verified` in its Kubernetes condition.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::time::Duration;

use chrono::Utc;
use railguard_agent::topology::fixture;
use railguard_e2e::scripted::{json, own_at, probe_rec, send, topo_rec, topology};
use railguard_e2e::*;
use railguard_schema::*;
use serde_json::Value;

/// The workload's transfers on GPU `gpu` through NIC `mlx5_<gpu>`: `mismatch` of them wrong, each
/// from `remote`, moved by `path`, made by `engine`.
fn inline(gpu: u32, mismatch: u64, remote: &str, path: DataPath, engine: Option<EngineIdentity>) -> wire::Record {
    inline_on(gpu, mismatch, remote, path, engine, false)
}

/// As [`inline`], for a simulated device (`simulated`: a real NIC moving the host memory that
/// stands in for the GPU's, or the simulated fabric).
fn inline_on(
    gpu: u32,
    mismatch: u64,
    remote: &str,
    path: DataPath,
    engine: Option<EngineIdentity>,
    simulated: bool,
) -> wire::Record {
    let at = Utc::now() - chrono::Duration::seconds(5);
    let failures = (0..mismatch)
        .map(|k| InlineFailure {
            request: format!("req-{gpu}-{k}"),
            remote: remote.into(),
            mismatch: true,
            blocks: 32,
            bad_blocks: 32,
            bad_block_indices: vec![0],
            first_bad_offset: Some(0),
            error: String::new(),
            at,
            bytes: 1 << 20,
            diagnosis: None,
            source: None,
            source_changed: false,
        })
        .collect();
    Record {
        id: RecordId::random(),
        observed_at: at,
        body: RecordBody::Inline(InlineReport {
            gpu: Some(gpu),
            gpu_bdf: None,
            nic: format!("mlx5_{gpu}"),
            nic_bdf: None,
            pid: 4242,
            process: "vllm".into(),
            memory: if path == DataPath::NicDma { Memory::Cuda } else { Memory::Host },
            path,
            attribution: "test".into(),
            transfers_ok: 40,
            transfers_mismatch: mismatch,
            transfers_error: 0,
            bytes_verified: 40 << 20,
            blocks_verified: 40 * 32,
            first_at: at - chrono::Duration::seconds(1),
            last_at: at,
            failures,
            failures_omitted: 0,
            transfers_mismatch_misplaced: 0,
            simulated,
            engine,
            sources_changed: 0,
            pod: None,
        }),
    }
    .into()
}

/// `w` (an in-line report) with every failure's bad blocks diagnosed `layout`: the source's bytes
/// rearranged after arrival, as the connector tells them apart by the blocks' set digests.
fn rearranged(w: wire::Record) -> wire::Record {
    let mut r = Record::try_from(w).unwrap();
    if let RecordBody::Inline(i) = &mut r.body {
        for f in &mut i.failures {
            f.diagnosis = Some(BlockDiagnosis { layout: f.bad_blocks, ..BlockDiagnosis::default() });
        }
        i.transfers_mismatch_misplaced = i.transfers_mismatch;
    }
    r.into()
}

/// A healthy bare-metal node's topology and ok probes of every GPU's own pair (simulated).
fn healthy() -> Vec<wire::Record> {
    let mut r = vec![topo_rec(topology(&fixture::dgx_h100_like(), None))];
    for g in 0..8u32 {
        r.extend(
            (0..4).map(|k| probe_rec(g, &format!("mlx5_{g}"), ProbeVerdict::Ok, PairSelection::Predicted, 30 + k)),
        );
    }
    r
}

/// A GPU's status; `null` while its node has not been assessed yet (404), so that a wait on it
/// goes on rather than failing.
fn gpu(c: &CollectorProc, node: &str, g: u32) -> Value {
    let path = format!("/api/v1/nodes/{node}/gpus/{g}");
    let (code, body) = c.get(&path, None);
    if code == 404 {
        return Value::Null;
    }
    assert_eq!(code, 200, "{path}: {body}");
    serde_json::from_str::<Value>(&body).unwrap()["status"].clone()
}

/// Whether a finding of `layer` calls for more than `ok`.
fn blames(v: &Value, layer: &str) -> bool {
    v["findings"].as_array().into_iter().flatten().any(|f| f["layer"] == layer && f["calls_for"] != "ok")
}

/// The layers a GPU's findings name (none while it is not assessed yet).
fn layers(v: &Value) -> Vec<String> {
    v["findings"].as_array().into_iter().flatten().filter_map(|f| Some(f["layer"].as_str()?.to_owned())).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_finding_names_its_layer_and_only_hardware_marks_a_gpu() {
    let pg = TestPg::start().await;
    let nodes = ["eng", "dec-a", "dec-b", "no-topo"];
    let c = CollectorProc::start_with(&pg.url(), &nodes, &[]);
    let vllm = EngineIdentity {
        name: "vllm".into(),
        version: "0.33.0".into(),
        connector: "RailguardNixlConnector".into(),
        settings: [("enable_prefix_caching".to_owned(), "true".to_owned())].into(),
    };
    // The engine: three transfers on eng's GPU2 arrive wrong, moved by a host copy.
    let mut eng = healthy();
    eng.push(inline(2, 3, "prefill-0", DataPath::HostCopy, Some(vllm)));
    // The engine again: two transfers on eng's GPU3 moved by its NIC's DMA, every block the
    // source's bytes rearranged (a decode engine permuting received blocks HND -> NHD), from the
    // source that corrupts dec-a's and dec-b's blocks below: they count against neither.
    let permuting = EngineIdentity {
        name: "vllm".into(),
        version: "0.33.0".into(),
        connector: "RailguardNixlConnector".into(),
        settings: [("enable_permute_local_kv".to_owned(), "true".to_owned())].into(),
    };
    eng.push(rearranged(inline(3, 2, "prefill-7", DataPath::NicDma, Some(permuting))));
    // A simulated device whose (host) memory a real NIC moved: its mismatches are marked as
    // simulation, and its clean transfers prove nothing of the GPU.
    eng.push(inline_on(5, 2, "prefill-5", DataPath::NicDma, None, true));
    send(&c, "eng", eng).await;
    // The other end: prefill-7 sends wrong bytes to GPUs 0 and 1 of dec-a and dec-b, through
    // their own NICs; dec-a's GPU2 gets wrong bytes from prefill-9 alone (its own source).
    for node in ["dec-a", "dec-b"] {
        let mut recs = healthy();
        recs.push(inline(0, 1, "prefill-7", DataPath::NicDma, None));
        recs.push(inline(1, 2, "prefill-7", DataPath::NicDma, None));
        if node == "dec-a" {
            recs.push(inline(2, 1, "prefill-9", DataPath::NicDma, None));
        }
        send(&c, node, recs).await;
    }
    // No topology: probes arrive, nothing names the GPUs' workload NICs.
    send(
        &c,
        "no-topo",
        (0..4).map(|k| probe_rec(1, "mlx5_1", ProbeVerdict::Ok, PairSelection::Predicted, 30 + k)).collect(),
    )
    .await;
    wait::until("every GPU assessed", Duration::from_secs(60), || {
        let n: usize =
            nodes.iter().map(|n| json(&c, &format!("/api/v1/nodes/{n}"))["gpus"].as_array().map_or(0, Vec::len)).sum();
        if n >= 25 { Ok(()) } else { Err(n) }
    });
    c.wait_for_a_later_pass();

    // The engine's: GPU2 is not corrupting, has no pin, and carries the engine finding.
    let g2 = gpu(&c, "eng", 2);
    assert_ne!(g2["status"], "corrupting", "{g2}");
    assert!(g2["recommendation"].is_null() && g2["pin"].is_null(), "{g2}");
    assert!(layers(&g2).contains(&"engine".to_owned()), "{g2}");
    let engines = json(&c, "/api/v1/engines?since=1h");
    let e = &engines["engines"][0];
    assert_eq!(
        (e["label"].as_str(), e["mismatches"].as_i64(), e["gpus"].as_i64()),
        (Some("vllm 0.33.0 (RailguardNixlConnector; enable_prefix_caching=true)"), Some(3), Some(1)),
        "{engines}"
    );
    let (_, metrics) = c.get("/metrics", None);
    assert!(
        metrics.contains("railguard_engine_kv_mismatches{engine=\"vllm\",version=\"0.33.0\",connector=\"RailguardNixlConnector\",settings=\"enable_prefix_caching=true\"} 3"),
        "{metrics}"
    );
    // Rearranged after arrival: GPU3's NIC moved the bytes, and still the engine is named, not
    // GPU3, its NIC or the source.
    let g3 = gpu(&c, "eng", 3);
    assert_ne!(g3["status"], "corrupting", "{g3}");
    assert!(g3["recommendation"].is_null() && g3["pin"].is_null(), "{g3}");
    assert!(layers(&g3).contains(&"engine".to_owned()) && !blames(&g3, "fabric"), "{g3}");
    assert!(
        g3["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["reason"].as_str().is_some_and(|r| r.contains("the source's bytes rearranged after arrival"))),
        "{g3}"
    );
    let e = &engines["engines"][1];
    assert_eq!(
        (e["label"].as_str(), e["mismatches"].as_i64(), e["misplaced"].as_i64()),
        (Some("vllm 0.33.0 (RailguardNixlConnector; enable_permute_local_kv=true)"), Some(2), Some(2)),
        "{engines}"
    );

    // The simulated device's: a fabric finding marked as simulation; nothing of it proven.
    let g5 = gpu(&c, "eng", 5);
    assert!(
        g5["findings"].as_array().unwrap().iter().any(|f| f["layer"] == "fabric"
            && f["reason"].as_str().is_some_and(|r| r.contains("(simulated: reported for a simulated GPU"))),
        "{g5}"
    );
    let node = json(&c, "/api/v1/nodes/eng");
    let pair = node["inline"].as_array().unwrap().iter().find(|p| p["gpu"] == 5).unwrap();
    assert_eq!((pair["ok"].as_i64(), pair["ok_nic"].as_i64()), (Some(40), Some(0)), "{pair}");
    let (_, metrics) = c.get("/metrics", None);
    assert!(
        metrics.contains(
            r#"railguard_gpu_info{node="eng",gpu="5",workload_nic="mlx5_5",verification="simulated",path="simulated""#
        ),
        "{metrics}"
    );

    // The other end's: all four decode GPUs name prefill-7, none is corrupting or pinned. dec-a's
    // GPUs were assessed when only two destinations had reported: dec-b's batch has them assessed
    // again (the blame moves off them without new evidence of their own).
    let decode = [("dec-a", 0), ("dec-a", 1), ("dec-b", 0), ("dec-b", 1)];
    wait::until("every destination of prefill-7 names it", Duration::from_secs(60), || {
        let named = decode
            .iter()
            .filter(|(node, g)| {
                gpu(&c, node, *g)["findings"].as_array().into_iter().flatten().any(|f| {
                    f["layer"] == "remote"
                        && f["reason"]
                            .as_str()
                            .is_some_and(|r| r.contains("prefill-7 (unattested): wrong bytes on 4 GPUs"))
                })
            })
            .count();
        if named == decode.len() { Ok(()) } else { Err(named) }
    });
    for (node, g) in decode {
        let v = gpu(&c, node, g);
        assert_ne!(v["status"], "corrupting", "{node} GPU{g}: {v}");
        assert!(v["pin"].is_null(), "{node} GPU{g}: {v}");
    }
    // The source, fleet-wide: the API, /metrics and `report` name it.
    let sources = json(&c, "/api/v1/sources?since=1h");
    let s0 = &sources["sources"][0];
    assert_eq!(
        (s0["source"].as_str(), s0["gpus"].as_i64(), s0["nodes"].as_i64(), s0["exclusive_gpus"].as_i64()),
        (Some("prefill-7"), Some(4), Some(2), Some(4)),
        "{sources}"
    );
    assert_eq!(sources["sources"].as_array().unwrap().len(), 1, "prefill-9 reached one GPU: no pattern: {sources}");
    let (_, metrics) = c.get("/metrics", None);
    assert!(
        metrics.contains(r#"railguard_source_kv_mismatch_gpus{source="prefill-7",attested="false",source_node="",source_gpu="",source_nic="",simulated="false"} 4"#),
        "{metrics}"
    );
    let out = std::process::Command::new(bin("railguard-collector"))
        .args(["report", "--since", "1h"])
        .env("DATABASE_URL", pg.url())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains(
            "prefill-7 (unattested): wrong bytes on 4 GPUs of 2 nodes, through their own NICs (4 from no other source)"
        ),
        "{text}"
    );
    assert!(
        text.contains("vllm 0.33.0 (RailguardNixlConnector; enable_prefix_caching=true): 3 in-line mismatches"),
        "{text}"
    );
    // A source of its own: the GPU's own path.
    let own = gpu(&c, "dec-a", 2);
    assert_eq!((own["status"].as_str(), own["layer"].as_str()), (Some("corrupting"), Some("fabric")), "{own}");
    let (_, metrics) = c.get("/metrics", None);
    assert!(metrics.contains(r#"railguard_gpu_info{node="dec-a",gpu="2",workload_nic="mlx5_2",verification="simulated",path="nic_dma",layer="fabric""#), "{metrics}");

    // No topology: unknown, never ok.
    let no = json(&c, "/api/v1/nodes/no-topo");
    let gpus = no["gpus"].as_array().unwrap();
    assert!(!gpus.is_empty() && gpus.iter().all(|g| g["status"] == "unknown"), "{no}");
    assert!(gpus[0]["reasons"][0].as_str().unwrap().contains("has sent no topology"), "{no}");

    // Kubernetes: the healthy simulated node is not `Verified` (nothing was proven on hardware).
    let rows = railguard_collector::store::read::gpus(&pg.pool, None, 1000).await.unwrap();
    let eng_rows: Vec<&_> = rows.iter().filter(|r| r.node == "dec-b").collect();
    let d = railguard_collector::tasks::k8s_nodes::desired(
        &eng_rows,
        Some(Utc::now()),
        Utc::now(),
        Duration::from_secs(300),
    );
    assert_ne!(d.reason, "Verified", "{}", d.message);
    assert!(d.message.contains("on the simulated fabric"), "{}", d.message);
}

/// One assignment of pins: the agent's `topo` on the seed node and the collector, given that node's
/// topology and probes, recommend the same NIC for every GPU (both spread them with
/// `railguard_schema::pins`), and the agent says how to set one per tensor-parallel rank.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_and_the_collector_pin_each_gpu_to_the_same_nic() {
    let pg = TestPg::start().await;
    let c = railguard_e2e::scripted::scripted_fleet(&pg).await;
    let dir = tempfile::tempdir().unwrap();
    fixture::seed_kvm_guest().write(dir.path()).unwrap();
    let out = std::process::Command::new(bin("railguard-agent"))
        .args(["topo", "--sysfs-root"])
        .arg(dir.path().join("sys"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut agent = std::collections::BTreeMap::new();
    let mut current = None;
    for line in text.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("GPU")
            && let Some((g, _)) = rest.split_once(' ')
            && let Ok(g) = g.parse::<u32>()
        {
            current = Some(g);
        }
        if let (Some(g), Some(rest)) = (current, l.strip_prefix("→ pin UCX_NET_DEVICES=")) {
            agent.insert(g, rest.split(':').next().unwrap().to_owned());
        }
    }
    assert_eq!(agent.len(), 8, "{text}");
    assert!(text.contains("export UCX_NET_DEVICES=${NICS[$LOCAL_RANK]}:1"), "the per-rank form: {text}");
    wait::until("every seed-auto GPU pinned", Duration::from_secs(60), || {
        let pins: std::collections::BTreeMap<u32, String> =
            (0..8u32).filter_map(|g| Some((g, gpu(&c, "seed-auto", g)["pin"]["nic"].as_str()?.to_owned()))).collect();
        if pins == agent { Ok(()) } else { Err(format!("collector {pins:?}, agent {agent:?}")) }
    });
}

/// `rec` (an in-line report) with every failure claiming `claim` as its source end.
fn claiming(mut rec: wire::Record, claim: wire::SourceClaim) -> wire::Record {
    if let Some(wire::record::Body::Inline(i)) = &mut rec.body {
        for f in &mut i.failures {
            f.source = Some(claim.clone());
        }
    }
    rec
}

/// `worker` announced by its node's agent on GPU `gpu` through `mlx5_<gpu>`, from pod
/// serving/source-<gpu>.
fn announced(worker: &str, gpu: u32) -> wire::Record {
    Record {
        id: RecordId::random(),
        observed_at: Utc::now() - chrono::Duration::seconds(30),
        body: RecordBody::SourceWorker(SourceWorker {
            worker: worker.into(),
            gpu,
            gpu_bdf: Some(format!("0000:{:02x}:00.0", 0x18 + gpu).parse().unwrap()),
            gpu_uuid: format!("GPU-{gpu}"),
            nic: format!("mlx5_{gpu}"),
            nic_bdf: None,
            pid: 4343,
            process: "vllm".into(),
            path: DataPath::NicDma,
            attribution: "test".into(),
            simulated: false,
            engine: None,
            pod: Some(railguard_schema::WorkloadPod {
                namespace: "serving".into(),
                name: format!("source-{gpu}"),
                container: "vllm".into(),
                uid: String::new(),
                container_id: String::new(),
                source: railguard_schema::PodSource::Kubelet,
            }),
        }),
    }
    .into()
}

fn source<'a>(sources: &'a Value, name: &str) -> &'a Value {
    sources["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == name)
        .unwrap_or_else(|| panic!("no source {name}: {sources}"))
}

/// Both ends: a source is named by the GPU/NIC pair its own node's agent attested. A
/// destination's failures naming it resolve to that pair whatever the source's manifests claim;
/// two names on one pair are one source; a name no node announced is shown by its name with its
/// manifests' claim, unattested; and no node can take a source over: one that announces a name
/// another node announced makes it disputed, naming neither.
#[tokio::test(flavor = "multi_thread")]
async fn a_source_is_named_by_the_pair_its_own_node_attests_and_no_node_can_take_it_over() {
    let pg = TestPg::start().await;
    let nodes = ["pre-a", "pre-b", "dec-c", "dec-d"];
    let c = CollectorProc::start_with(&pg.url(), &nodes, &[]);
    let spec = json(&c, "/api/v1/openapi.json");
    send(
        &c,
        "pre-a",
        vec![announced("prefill-8|tp0pp0", 3), announced("prefill-8b|tp0pp0", 3), announced("prefill-9|tp0pp0", 1)],
    )
    .await;
    send(&c, "pre-b", vec![announced("prefill-9|tp0pp0", 2)]).await;
    // The source's manifests lie about where it is: they name dec-c's GPU0.
    let lie = wire::SourceClaim { node: "dec-c".into(), gpu_bdf: "0000:18:00.0".into(), nic: "mlx5_0".into() };
    let elsewhere = wire::SourceClaim { node: "pre-z".into(), gpu_bdf: String::new(), nic: "mlx5_9".into() };
    for node in ["dec-c", "dec-d"] {
        let mut recs = healthy();
        for g in [0, 1] {
            recs.push(claiming(inline(g, 2, "prefill-8|tp0pp0/req", DataPath::NicDma, None), lie.clone()));
        }
        recs.push(inline(2, 1, "prefill-9|tp0pp0/req", DataPath::NicDma, None));
        recs.push(claiming(inline(4, 1, "prefill-10/req", DataPath::NicDma, None), elsewhere.clone()));
        if node == "dec-d" {
            recs.push(inline(6, 1, "prefill-8b|tp0pp0/req", DataPath::NicDma, None));
        }
        send(&c, node, recs).await;
    }

    let sources = json(&c, "/api/v1/sources?since=1h");
    railguard_e2e::openapi::check(&spec, "/api/v1/sources", 200, &sources).unwrap_or_else(|e| panic!("{e}"));
    // Attested: pre-a's GPU3 through mlx5_3, under both its names; the lie is not shown.
    let s8 = source(&sources, "prefill-8b|tp0pp0");
    assert_eq!(
        (
            s8["end"]["attestation"].as_str(),
            s8["end"]["node"].as_str(),
            s8["end"]["gpu"].as_u64(),
            s8["end"]["nic"].as_str()
        ),
        (Some("attested"), Some("pre-a"), Some(3), Some("mlx5_3")),
        "{sources}"
    );
    assert_eq!(
        (s8["names"].as_i64(), s8["gpus"].as_i64(), s8["nodes"].as_i64()),
        (Some(2), Some(5), Some(2)),
        "{sources}"
    );
    assert!(s8["claim"].is_null(), "an attested source's claim is not its evidence: {sources}");
    assert!(
        s8["reason"].as_str().unwrap().starts_with("node pre-a GPU3 (0000:1b:00.0) through mlx5_3, attested"),
        "{sources}"
    );
    // The pod its own node's agent named when it announced itself: a name for the source end.
    assert_eq!(
        s8["end"]["pod"],
        serde_json::json!({"namespace": "serving", "name": "source-3", "container": "vllm", "source": "kubelet"}),
        "{sources}"
    );
    assert!(s8["reason"].as_str().unwrap().contains("; pod serving/source-3, container vllm)"), "{sources}");
    // Disputed: two nodes announced prefill-9; neither is named.
    let s9 = source(&sources, "prefill-9|tp0pp0");
    assert_eq!(
        (s9["end"]["attestation"].as_str(), s9["end"]["announced_by"].as_i64()),
        (Some("disputed"), Some(2)),
        "{sources}"
    );
    assert!(s9["end"]["node"].is_null() && s9["end"]["pod"].is_null(), "a disputed name names no pod: {sources}");
    // Unannounced: its name, and what its manifests claimed, as their word.
    let s10 = source(&sources, "prefill-10");
    assert_eq!(
        (s10["end"]["attestation"].as_str(), s10["claim"]["node"].as_str()),
        (Some("unannounced"), Some("pre-z")),
        "{sources}"
    );
    assert!(
        s10["reason"]
            .as_str()
            .unwrap()
            .contains("its manifests claim node pre-z through mlx5_9 (the source's own word)"),
        "{sources}"
    );

    // Each destination's remote finding names the attested pair, and none is marked for it.
    wait::until("dec-c GPU0's remote finding names pre-a's pair", Duration::from_secs(60), || {
        let v = gpu(&c, "dec-c", 0);
        let named = v["findings"].as_array().into_iter().flatten().any(|f| {
            f["layer"] == "remote"
                && f["reason"].as_str().is_some_and(|r| {
                    r.contains("node pre-a GPU3 (0000:1b:00.0) through mlx5_3, attested (prefill-8")
                        && r.contains("pod serving/source-3, container vllm)")
                        && r.contains("wrong bytes on 5 GPUs")
                })
        });
        if named { Ok(()) } else { Err(v) }
    });
    for (node, g) in [("dec-c", 0), ("dec-c", 1), ("dec-d", 6)] {
        let v = gpu(&c, node, g);
        assert_ne!(v["status"], "corrupting", "{node} GPU{g}: {v}");
        assert!(v["pin"].is_null(), "{node} GPU{g}: {v}");
    }
    let (_, metrics) = c.get("/metrics", None);
    assert!(
        metrics.contains(r#"railguard_source_kv_mismatch_gpus{source="prefill-8b|tp0pp0",attested="true",source_node="pre-a",source_gpu="3",source_nic="mlx5_3",simulated="false"} 5"#),
        "{metrics}"
    );

    // dec-c announces pre-a's name as its own: the name is disputed, and dec-c is not named.
    send(&c, "dec-c", vec![announced("prefill-8|tp0pp0", 0)]).await;
    let sources = json(&c, "/api/v1/sources?since=1h");
    let s8 = source(&sources, "prefill-8|tp0pp0");
    assert_eq!(s8["end"]["attestation"].as_str(), Some("disputed"), "{sources}");
    assert!(
        !sources["sources"].as_array().unwrap().iter().any(|s| s["end"]["node"] == "dec-c"),
        "a node cannot take a source over: {sources}"
    );

    // A source whose own node proves its pair clean is nobody's excuse: pre-a's GPU5 is `ok`,
    // proven by its own probes through mlx5_5 in GPU memory, and serves prefill-11. Two
    // destinations' mismatches from it stay theirs, however many report it.
    let mut recs = vec![topo_rec(topology(&fixture::dgx_h100_like(), None)), announced("prefill-11|tp0pp0", 5)];
    recs.extend(own_at(5, Memory::Cuda, 5, 1));
    send(&c, "pre-a", recs).await;
    wait::until("pre-a GPU5 ok and proven", Duration::from_secs(60), || {
        let (_, body) = c.get("/api/v1/nodes/pre-a/gpus/5", None);
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        if v["status"]["status"] == "ok" && v["status"]["proven"] == true { Ok(()) } else { Err(body) }
    });
    for node in ["dec-c", "dec-d"] {
        send(&c, node, vec![inline(7, 2, "prefill-11|tp0pp0/req", DataPath::NicDma, None)]).await;
    }
    for node in ["dec-c", "dec-d"] {
        wait::until(&format!("{node} GPU7 judged on its own path"), Duration::from_secs(60), || {
            let v = gpu(&c, node, 7);
            if v["status"] == "corrupting" { Ok(()) } else { Err(v) }
        });
    }
    for node in ["dec-c", "dec-d"] {
        let v = gpu(&c, node, 7);
        assert_eq!((v["status"].as_str(), v["layer"].as_str()), (Some("corrupting"), Some("fabric")), "{node}: {v}");
        assert!(!layers(&v).contains(&"remote".to_owned()), "{node}: {v}");
    }
    let sources = json(&c, "/api/v1/sources?since=1h");
    assert!(
        !sources["sources"].as_array().unwrap().iter().any(|s| s["source"] == "prefill-11|tp0pp0"),
        "a source proven clean by its own node is not listed: {sources}"
    );
}

/// `w` (an in-line report) turned into the source side's word: the blocks it lent out for
/// `request` as worker `worker` changed before a destination's READ was confirmed.
fn changed_at_source(w: wire::Record, worker: &str, request: &str) -> wire::Record {
    let mut r = Record::try_from(w).unwrap();
    if let RecordBody::Inline(i) = &mut r.body {
        let mut f = i.failures[0].clone();
        f.request = request.into();
        f.remote = format!("{worker}/{request}");
        f.mismatch = false;
        f.source_changed = true;
        f.bad_blocks = 1;
        f.bad_block_indices = vec![2];
        f.first_bad_offset = None;
        f.error = "the source's blocks changed before the destination's READ was confirmed".into();
        i.failures = vec![f];
        i.transfers_mismatch = 0;
        i.sources_changed = 1;
    }
    r.into()
}

/// A transfer its source's own node reports changed at the source before the READ was confirmed
/// (vLLM's block-reuse race on the prefill side) is the engine's: the decode GPU whose NIC moved
/// the bytes is not `corrupting` and gets no pin, though the source's word arrives after the
/// destination's. Only the node that announced the worker, for the GPU it announced, can say so:
/// the same claim from another node leaves the destination's own path to blame.
#[tokio::test(flavor = "multi_thread")]
async fn a_transfer_its_own_source_reports_changed_is_the_engines_and_no_other_node_can_say_so() {
    let pg = TestPg::start().await;
    let nodes = ["pre", "dec-c", "liar"];
    let c = CollectorProc::start_with(&pg.url(), &nodes, &[]);
    // The decode node first: GPU1 and GPU2 each got one transfer of wrong bytes from the same
    // prefill worker, through their own NICs (`corrupt`: no diagnosis says otherwise).
    let mut dec = healthy();
    dec.push(inline(1, 1, "pre-engine|tp0pp0/req-1", DataPath::NicDma, None));
    dec.push(inline(2, 1, "pre-engine|tp0pp0/req-2", DataPath::NicDma, None));
    send(&c, "dec-c", dec).await;
    // Two destinations of one source, and no other source: the other end's, so far.
    wait::until("dec-c's GPUs naming their source", Duration::from_secs(60), || {
        let named = [1, 2].iter().filter(|g| layers(&gpu(&c, "dec-c", **g)).contains(&"remote".to_owned())).count();
        if named == 2 { Ok(()) } else { Err(named) }
    });
    // Then the source: its node announced the worker on GPU0 and reports req-1 changed there. A
    // node that announced nothing claims req-2 changed.
    let mut pre = healthy();
    pre.push(announced("pre-engine|tp0pp0", 0));
    pre.push(changed_at_source(inline(0, 1, "x", DataPath::NicDma, None), "pre-engine|tp0pp0", "req-1"));
    send(&c, "pre", pre).await;
    let mut liar = healthy();
    liar.push(changed_at_source(inline(0, 1, "x", DataPath::NicDma, None), "pre-engine|tp0pp0", "req-2"));
    send(&c, "liar", liar).await;

    let g1 = wait::until("dec-c GPU1 the engine's by its source's word", Duration::from_secs(60), || {
        let v = gpu(&c, "dec-c", 1);
        if blames(&v, "engine") { Ok(v) } else { Err(v.to_string()) }
    });
    assert_ne!(g1["status"], "corrupting", "{g1}");
    assert!(g1["pin"].is_null() && g1["recommendation"].is_null(), "{g1}");
    assert!(!blames(&g1, "fabric") && !blames(&g1, "remote"), "{g1}");
    // GPU2's transfer stays wrong bytes on its own path: the liar's word is nobody's, and with
    // req-1 explained the source reached one GPU only, so no pattern moves the blame off it.
    let g2 = wait::until("dec-c GPU2 its own path's", Duration::from_secs(60), || {
        let v = gpu(&c, "dec-c", 2);
        if v["status"] == "corrupting" { Ok(v) } else { Err(v.to_string()) }
    });
    assert_eq!(g2["layer"].as_str(), Some("fabric"), "{g2}");
    // The source GPU itself is not marked for the change it reported.
    let p0 = gpu(&c, "pre", 0);
    assert_ne!(p0["status"], "corrupting", "{p0}");
    assert!(!blames(&p0, "fabric"), "a source-side change is no fault of the source's path: {p0}");
    // Fleet-wide, the change counts against the engine, once: the liar's claim does not.
    let engines = json(&c, "/api/v1/engines?since=1h");
    let changed: i64 =
        engines["engines"].as_array().unwrap().iter().filter_map(|e| e["changed_at_source"].as_i64()).sum();
    assert_eq!(changed, 1, "{engines}");
}
