//! Assessment and the read-only API on real Postgres, fed over gRPC with scripted record
//! streams: the seed under auto-selection, the seed pinned to mlx5_0:1, a healthy node with
//! one transient failure, and an Xid storm on one GPU.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use railguard_agent::topology::fixture;
use railguard_e2e::scripted::*;
use railguard_e2e::*;
use railguard_schema::{PairSelection, ProbeVerdict};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread")]
async fn scripted_streams_get_the_expected_status_reasons_and_pin() {
    let pg = TestPg::start().await;
    let c = scripted_fleet(&pg).await;

    assert_eq!(statuses(&c, "seed-auto"), vec!["corrupting"; 8]);
    let gpu3 = json(&c, "/api/v1/nodes/seed-auto/gpus/3");
    let reasons: Vec<&str> =
        gpu3["status"]["reasons"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    assert!(
        reasons[0].contains("GPU3 via mlx5_3")
            && reasons[0].contains("4 of 4 probes")
            && reasons[0].contains("untouched"),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r.contains("structural risk high")), "{reasons:?}");
    // The scripted nodes are simulated: their pins say so. The node's 8 GPUs all move, and
    // spread one per NIC over their NUMA node's safe NICs (GPU3's is mlx5_2), each with the
    // cost of leaving its PIX path.
    assert_eq!(
        gpu3["status"]["recommendation"],
        "UCX_NET_DEVICES=mlx5_2:1 (verified on the simulated fabric, not on hardware)"
    );
    assert!(
        reasons.iter().any(|r| r.starts_with("recommendation: set UCX_NET_DEVICES=mlx5_2:1")
            && r.contains("expected cost: its KV transfers leave the PIX path to mlx5_3")),
        "{reasons:?}"
    );
    let mut pins: Vec<String> = (0..8)
        .map(|g| {
            let v = json(&c, &format!("/api/v1/nodes/seed-auto/gpus/{g}"));
            v["status"]["recommendation"].as_str().unwrap().split(' ').next().unwrap().to_owned()
        })
        .collect();
    pins.sort();
    pins.dedup();
    assert_eq!(pins.len(), 8, "one NIC per GPU: {pins:?}");
    assert_eq!(gpu3["status"]["verification"], "simulated");
    assert_eq!(gpu3["status"]["workload_nic"], "mlx5_3");
    // The same recommendation as fields a script applies without parsing the sentence.
    let pin = &gpu3["status"]["pin"];
    assert_eq!(
        (&pin["nic"], &pin["env"], &pin["verified"], &pin["evidence"]),
        (&"mlx5_2".into(), &"UCX_NET_DEVICES=mlx5_2:1".into(), &false.into(), &"simulated".into()),
        "{pin}"
    );
    assert_eq!((&pin["from_path_class"], &pin["path_class"]), (&"pix".into(), &"phb".into()), "{pin}");
    assert!(pin["why"].as_str().unwrap().starts_with("GPU3 via mlx5_3"), "{pin}");
    // The workload's current selection: UCX's own on seed-auto, pinned on seed-pinned.
    assert_eq!(gpu3["status"]["workload_pinned"], false, "{gpu3}");
    let healthy0 = json(&c, "/api/v1/nodes/healthy/gpus/0");
    assert!(healthy0["status"]["pin"].is_null(), "a GPU that stays has no pin: {healthy0}");

    let pinned = statuses(&c, "seed-pinned");
    assert_eq!(pinned[0], "corrupting");
    assert_eq!(&pinned[1..], vec!["watch"; 7], "not corrupting: their own PIX pair is bad but unused");
    let g0 = json(&c, "/api/v1/nodes/seed-pinned/gpus/0");
    assert_eq!(g0["status"]["workload_pinned"], true, "{g0}");
    assert_eq!(
        g0["status"]["recommendation"],
        "UCX_NET_DEVICES=mlx5_1:1 (verified on the simulated fabric, not on hardware)"
    );

    let healthy = statuses(&c, "healthy");
    assert_eq!(healthy[2], "watch");
    assert!(healthy.iter().enumerate().all(|(g, s)| g == 2 || s == "ok"), "{healthy:?}");
    let g2 = json(&c, "/api/v1/nodes/healthy/gpus/2");
    assert!(g2["status"]["reasons"][0].as_str().unwrap().contains("one transient failure"), "{g2}");

    // Every probe of tcp-only verified, none through a NIC: no GPU there is ok.
    assert_eq!(statuses(&c, "tcp-only"), vec!["watch"; 8]);
    let t3 = json(&c, "/api/v1/nodes/tcp-only/gpus/3");
    assert_eq!(t3["status"]["verification"], "unproven");
    assert!(
        t3["status"]["reasons"][0]
            .as_str()
            .unwrap()
            .contains("its NIC path is unverified (probes on this node exercise no NIC of the pair: tcp)"),
        "{t3}"
    );

    let storm = statuses(&c, "xid-storm");
    assert_eq!(storm[7], "at_risk");
    assert!(storm[..7].iter().all(|s| s == "ok"), "{storm:?}");

    // The fleet view never hides a bad GPU behind a node aggregate.
    let fleet = json(&c, "/api/v1/fleet");
    assert_eq!(fleet["totals"]["corrupting"], 9);
    assert_eq!(fleet["nodes"][0]["worst"], "corrupting");
    let pinned_row = fleet["nodes"].as_array().unwrap().iter().find(|n| n["node"] == "seed-pinned").unwrap();
    assert_eq!(pinned_row["status_counts"]["corrupting"], 1);
    assert!(fleet["changes_last_hour"].as_array().unwrap().len() >= 32);

    // Status filter across the fleet.
    let bad = json(&c, "/api/v1/gpus?status=corrupting,at_risk");
    let list = bad["gpus"].as_array().unwrap();
    assert_eq!(list.len(), 10);
    assert_eq!(list[0]["status"], "corrupting");
    assert_eq!(list.last().unwrap()["node"], "xid-storm");

    // History: probes, signals and status changes of one GPU.
    let h = json(&c, "/api/v1/nodes/xid-storm/gpus/7/history?since=1h");
    assert_eq!(h["signals"].as_array().unwrap().len(), 40);
    assert_eq!(h["probes"].as_array().unwrap().len(), 1);
    assert_eq!(h["status_changes"][0]["to"], "at_risk");
    let h = json(&c, "/api/v1/nodes/seed-auto/gpus/0/history?since=1h&limit=3");
    assert_eq!(h["probes"].as_array().unwrap().len(), 3);
    // Each probe's provenance is kept and served: the simulated fabric, host memory, nothing injected.
    assert_eq!(h["probes"][0]["verdict"], "silent_corruption");
    assert_eq!(
        (&h["probes"][0]["memory"], &h["probes"][0]["path"], &h["probes"][0]["injected"]),
        (&"host".into(), &"simulated".into(), &"none".into())
    );

    // Which GPUs failed verification, on which NIC, how often.
    let f = json(&c, "/api/v1/failures?since=30d");
    let rows = f["failures"].as_array().unwrap();
    assert_eq!(rows.len(), 8 + 8 + 1, "{rows:?}");
    assert_eq!(rows[0]["failures"], 4);
    let out = std::process::Command::new(bin("railguard-collector"))
        .args(["query", "failures", "--since", "1d", "--json"])
        .env("DATABASE_URL", pg.url())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli.as_array().unwrap().len(), 17);
    let table = std::process::Command::new(bin("railguard-collector"))
        .args(["query", "gpus", "--status", "corrupting"])
        .env("DATABASE_URL", pg.url())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert_eq!(text.lines().count(), 1 + 9, "{text}");
    assert!(text.lines().next().unwrap().contains("recommendation"), "{text}");

    // Every command the alerts cite runs, for a node the alert would name.
    let rules =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus/railguard-alerts.yml"))
            .unwrap();
    let cited: Vec<&str> =
        rules.split('`').skip(1).step_by(2).filter(|c| c.starts_with("railguard-collector ")).collect();
    assert!(!cited.is_empty(), "the alerts cite no railguard command");
    for command in cited {
        let command = command.replace("{{ $labels.node }}", "seed-auto");
        let words: Vec<&str> = command.split_whitespace().skip(1).collect();
        let out = std::process::Command::new(bin("railguard-collector"))
            .args(&words)
            .env("DATABASE_URL", pg.url())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(text.lines().filter(|l| l.starts_with("seed-auto")).count(), 8, "{command}: {text}");
    }
    // An unknown node is an error that names it; a missing database is never created.
    let out = std::process::Command::new(bin("railguard-collector"))
        .args(["query", "gpus", "--node", "nope"])
        .env("DATABASE_URL", pg.url())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no node \"nope\""), "{out:?}");
    let elsewhere = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin("railguard-collector"))
        .args(["query", "gpus"])
        .env_remove("DATABASE_URL")
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no collector database under") && err.contains("--collector http://"), "{out:?}");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0, "nothing created where it ran");

    // Export (Parquet and CSV) and the fleet report, from the CLI.
    let out_dir = tempfile::tempdir().unwrap();
    for format in ["parquet", "csv"] {
        let out = std::process::Command::new(bin("railguard-collector"))
            .args(["export", "--since", "1d", "--format", format, "--out"])
            .arg(out_dir.path().join(format))
            .env("DATABASE_URL", pg.url())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let pq = std::fs::read(out_dir.path().join("parquet/probes.parquet")).unwrap();
    assert!(pq.starts_with(b"PAR1") && pq.ends_with(b"PAR1"), "a Parquet file");
    let csv = std::fs::read_to_string(out_dir.path().join("csv/probes.csv")).unwrap();
    let probes_stored: i64 = pg.count("probe_results").await;
    assert_eq!(csv.lines().count() as i64, probes_stored + 1, "header + every probe");
    assert!(csv.lines().next().unwrap().contains("verdict"));
    let sig = std::fs::read_to_string(out_dir.path().join("csv/signals.csv")).unwrap();
    assert_eq!(sig.lines().count(), 41);
    assert!(out_dir.path().join("parquet/status_changes.parquet").exists());
    let out = std::process::Command::new(bin("railguard-collector"))
        .args(["report", "--since", "1d", "--json"])
        .env("DATABASE_URL", pg.url())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let patterns = report["patterns"].as_array().unwrap();
    assert!(
        patterns.iter().any(|p| p["what"] == "GPU index" && p["value"] == "3" && p["nodes"] == 2),
        "GPU3 fails on both seed nodes: {patterns:?}"
    );
    assert_eq!(report["per_gpu"][0]["failures"], 4);
    // The one line that explains the failing pairs (here: simulated, and said to be).
    let why = report["explanation"]["summary"].as_str().unwrap();
    assert!(
        why.starts_with("[simulated fabric] 16 of 17 failing pairs are PIX pairs in QEMU guests without vIOMMU"),
        "{why}"
    );
    let out = std::process::Command::new(bin("railguard-collector"))
        .args(["report", "--since", "1d"])
        .env("DATABASE_URL", pg.url())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("what explains the failures (medium confidence): [simulated fabric] 16 of 17"), "{text}");
    // One sentence, not a line per GPU index: those stay in --json.
    assert!(!text.contains("GPU index 3 fails verification on"), "{text}");
    assert!(text.contains("per-GPU-index patterns behind it: --json"), "{text}");
    // The scripted seed nodes are simulated: the report says so on every row.
    assert!(report["per_pair"].as_array().unwrap().iter().all(|r| r["simulated"] == true), "{report}");

    // Prometheus metrics.
    let (code, m) = c.get("/metrics", None);
    assert_eq!(code, 200);
    assert!(m.contains("railguard_gpu_status{node=\"seed-auto\",gpu=\"3\",status=\"corrupting\"} 1"), "{m}");
    assert!(m.contains("railguard_gpu_status{node=\"seed-auto\",gpu=\"3\",status=\"ok\"} 0"));
    assert!(m.contains("railguard_probe_verdicts_total{node=\"seed-auto\",gpu=\"3\",nic=\"mlx5_3\",verdict=\"silent_corruption\",path=\"simulated\",simulated=\"true\"} 4"), "{m}");
    assert!(m.contains("railguard_ingest_records_total{result=\"stored\"}"));
    assert!(m.contains("railguard_node_last_seen_age_seconds{node=\"healthy\"}"));
    // seed-auto sent two batches (its topology, then its probes): its cadence is known; the
    // silent-agent alert compares its silence with it.
    assert!(m.contains("railguard_node_batch_interval_seconds{node=\"seed-auto\"}"), "{m}");
    // The GPU's identity from its node's topology, to join with DCGM's series or a scheduler's.
    let info = m.lines().find(|l| l.starts_with("railguard_gpu_info{node=\"seed-auto\",gpu=\"3\",")).unwrap();
    let value = |k: &str| info.split(&format!("{k}=\"")).nth(1).map(|v| v[..v.find('"').unwrap()].to_owned());
    let topo = json(&c, "/api/v1/nodes/seed-auto");
    let g3 = topo["topology"]["gpus"].as_array().unwrap().iter().find(|g| g["index"] == 3).unwrap();
    assert_eq!(value("pci_bus_id").as_deref(), g3["bdf"].as_str(), "{info} {g3}");
    assert_eq!(value("uuid").as_deref(), g3["uuid"].as_str(), "{info} {g3}");
    assert_eq!(value("model").as_deref(), g3["name"].as_str(), "{info} {g3}");
    assert!(!value("pci_bus_id").unwrap().is_empty(), "{info}");

    // Every answer is what the OpenAPI document promises: every field described, every type
    // and enum value right, on a fleet where every kind of row exists.
    let spec = json(&c, "/api/v1/openapi.json");
    for path in [
        "/api/v1/info",
        "/api/v1/fleet",
        "/api/v1/gpus",
        "/api/v1/gpus?status=corrupting,at_risk&limit=5",
        "/api/v1/failures?since=30d",
        "/api/v1/patterns",
        "/api/v1/patterns?since=1d",
        "/api/v1/grid",
        "/api/v1/grid?at=1h",
        "/api/v1/grid?status=corrupting&limit=1",
        "/api/v1/grid?at=1h&hv=none&limit=2",
        "/api/v1/nodes/seed-auto",
        "/api/v1/nodes/xid-storm",
        "/api/v1/nodes/seed-auto/gpus/3",
        "/api/v1/nodes/xid-storm/gpus/7",
        "/api/v1/nodes/xid-storm/gpus/7/history?since=1h",
        "/api/v1/nodes/seed-pinned/gpus/0/history?since=1h",
        "/api/v1/fleet/series",
        "/api/v1/fleet/series?since=1h&points=2",
        "/api/v1/nodes/seed-auto/nics/series",
        "/api/v1/nodes/seed-auto/nics/series?since=30d&bucket=day",
    ] {
        let (code, body) = c.get(path, None);
        assert_eq!(code, 200, "{path}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        openapi::check(&spec, path, code, &body).unwrap_or_else(|e| panic!("{e}"));
    }
    // This collector, as /metrics' railguard_collector_info says it: the default runbooks.
    let info = json(&c, "/api/v1/info");
    assert_eq!(info["runbook_url"], "https://github.com/railguard/railguard/blob/main/docs/", "{info}");
    assert!(info["dashboard_url"].as_str().is_some_and(|u| u.starts_with("http://") && u.ends_with('/')), "{info}");
    // The series: the fleet's nine corrupting GPUs at the last point; each seed NIC's probes.
    let fs = json(&c, "/api/v1/fleet/series?since=1h");
    let last = fs["points"].as_array().unwrap().last().unwrap().clone();
    assert_eq!((fs["points"].as_array().unwrap().len(), &last["corrupting"]), (120, &Value::from(9)), "{fs}");
    let ns = json(&c, "/api/v1/nodes/seed-auto/nics/series?since=1h");
    let failed: i64 = ns["buckets"].as_array().unwrap().iter().map(|b| b["failed"].as_i64().unwrap()).sum();
    assert_eq!(failed, 8 * 4, "each GPU's 4 failed probes of its PIX pair: {ns}");
    for (path, want) in [
        ("/api/v1/fleet/series?points=1", 400),
        ("/api/v1/fleet/series?points=x", 400),
        ("/api/v1/fleet/series?points=", 400),
        ("/api/v1/nodes/nope/nics/series", 404),
        ("/api/v1/nodes/seed-auto/nics/series?bucket=week", 400),
    ] {
        assert_eq!(c.get(path, None).0, want, "{path}");
    }
    // A period that ends after now is read up to now, and the answer says so (a kept period
    // must not end after the clock).
    let ahead = (chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let p = json(&c, &format!("/api/v1/patterns?since=1h&until={ahead}"));
    let until: chrono::DateTime<chrono::Utc> = p["until"].as_str().unwrap().parse().unwrap();
    assert!(until <= chrono::Utc::now(), "{p}");
    assert_eq!(p["failing"], json(&c, "/api/v1/patterns")["failing"], "{p}");
    // A period's length read the first time is read whole and kept; read again it is moved on
    // from the kept one, with the same answer; /metrics counts both (not waiting behind a read).
    let period_reads = |how: &str| -> u64 {
        let (_, m) = c.get("/metrics", None);
        let prefix = format!("railguard_patterns_period_reads_total{{how=\"{how}\"}} ");
        m.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{m}"))
    };
    let (moved, whole) = (period_reads("moved"), period_reads("whole"));
    let first = json(&c, "/api/v1/patterns?since=37m");
    assert_eq!((period_reads("moved"), period_reads("whole")), (moved, whole + 1), "{first}");
    let again = json(&c, "/api/v1/patterns?since=37m");
    assert_eq!((period_reads("moved"), period_reads("whole")), (moved + 1, whole + 1), "{again}");
    assert_eq!(
        (&first["pairs"], &first["failing"], &first["factor"]),
        (&again["pairs"], &again["failing"], &again["factor"])
    );
    assert!(first["failing"].as_u64().unwrap() > 0, "{first}");
    // The check is not vacuous: an undocumented field or a wrong enum value fails it.
    let mut gpu = json(&c, "/api/v1/nodes/seed-auto/gpus/3");
    gpu["status"]["secret"] = Value::from(1);
    assert!(openapi::check(&spec, "/api/v1/nodes/seed-auto/gpus/3", 200, &gpu).is_err());
    let mut gpu = json(&c, "/api/v1/nodes/seed-auto/gpus/3");
    gpu["status"]["status"] = Value::from("melting");
    assert!(openapi::check(&spec, "/api/v1/nodes/seed-auto/gpus/3", 200, &gpu).is_err());

    // Bounded labels: an agent that sends made-up NIC names and GPU indexes does not grow
    // /metrics; its probes are counted under "other". (Last: they are stored like any probe.)
    let forged: Vec<_> = (0..300)
        .map(|i| {
            probe_rec(
                if i % 2 == 0 { 48 + i % 16 } else { 1 },
                &format!("forged-nic-{i}"),
                ProbeVerdict::Ok,
                PairSelection::Sweep,
                20,
            )
        })
        .collect();
    send(&c, "healthy", forged).await;
    let (_, m) = c.get("/metrics", None);
    assert!(!m.contains("forged-nic") && !m.contains("gpu=\"48\"") && !m.contains("gpu=\"62\""), "{m}");
    assert!(
        m.contains("railguard_probe_verdicts_total{node=\"healthy\",gpu=\"other\",nic=\"other\",verdict=\"ok\",path=\"simulated\",simulated=\"true\"} 150"),
        "{m}"
    );
    assert!(
        m.contains("railguard_probe_verdicts_total{node=\"healthy\",gpu=\"1\",nic=\"other\",verdict=\"ok\",path=\"simulated\",simulated=\"true\"} 150"),
        "{m}"
    );
    // An agent's quarantined spool piece is counted on /metrics (and not before it arrives).
    assert!(!m.contains("railguard_agent_spool_quarantined_total{node=\"healthy\"}"), "{m}");
    let q = railguard_schema::SignalEvent {
        source: railguard_schema::SignalSource::Agent,
        kind: railguard_schema::SignalKind::AgentSpoolQuarantine,
        bdf: None,
        gpu: None,
        nic: String::new(),
        summary: "3 spooled byte(s) could not be decoded".into(),
        attrs: Default::default(),
    };
    send(&c, "healthy", vec![railguard_schema::Record::now(railguard_schema::RecordBody::Signal(q)).into()]).await;
    let (_, m2) = c.get("/metrics", None);
    assert!(m2.contains("railguard_agent_spool_quarantined_total{node=\"healthy\"} 1"), "{m2}");
    // Devices the topology lists keep their own labels.
    assert!(
        m.contains("railguard_probe_verdicts_total{node=\"healthy\",gpu=\"2\",nic=\"mlx5_2\",verdict=\"ok\""),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn api_contract_bad_parameters_get_400_and_json() {
    let pg = TestPg::start().await;
    let c = CollectorProc::start_with(&pg.url(), &NODES, &[]);
    send(&c, "healthy", vec![topo_rec(topology(&fixture::dgx_h100_like(), None))]).await;
    let spec = json(&c, "/api/v1/openapi.json");
    assert!(spec["openapi"].as_str().unwrap().starts_with("3.1"), "{}", spec["openapi"]);
    for (path, code, needle) in [
        ("/api/v1/nodes/bad!node", 400, "node"),
        ("/api/v1/nodes/nobody", 404, "no node \"nobody\""),
        ("/api/v1/nodes/healthy/gpus/abc", 400, "GPU index"),
        ("/api/v1/nodes/healthy/gpus/99", 404, "no GPU99"),
        ("/api/v1/gpus?status=melting", 400, "melting"),
        ("/api/v1/gpus?limit=0", 400, "limit"),
        ("/api/v1/gpus?limit=x", 400, "limit"),
        ("/api/v1/gpus?limit=", 400, "limit"),
        ("/api/v1/nodes/healthy/gpus/0/history?since=yesterday", 400, "since"),
        ("/api/v1/gpus?status=ok&status=watch", 400, "duplicate field"),
        ("/api/v1/nodes/healthy/gpus/0/history?limit=20000", 400, "limit"),
        ("/api/v1/failures?since=2026-13-45", 400, "since"),
        ("/api/v1/nodes/x'%3B%20DROP%20TABLE%20nodes", 400, "node"),
    ] {
        let (got, body) = c.get(path, None);
        assert_eq!(got, code, "{path}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{path}: not JSON: {body}"));
        assert!(v["error"].as_str().unwrap().contains(needle), "{path}: {body}");
        // Words for people, not Rust's debug text.
        assert!(!body.contains("NodeId(") && !body.contains("Some("), "{path}: {body}");
        // The document promises this error body for this status.
        openapi::check(&spec, path, got, &v).unwrap_or_else(|e| panic!("{e}"));
    }
    // Good requests on an empty fleet answer 200 with empty lists, as the document says.
    for path in [
        "/api/v1/fleet",
        "/api/v1/gpus",
        "/api/v1/failures",
        "/api/v1/nodes/healthy",
        "/api/v1/nodes/healthy/gpus/0/history",
        // What the document allows is accepted: empty means absent, any duration it matches.
        "/api/v1/gpus?status=",
        "/api/v1/nodes/healthy/gpus/0/history?since=&until=",
        "/api/v1/failures?since=999999999d&until=0s",
        "/api/v1/failures?since=2026-01-01T00:00:00.5%2B02:00",
        // since after until: an empty period, not an error.
        "/api/v1/nodes/healthy/gpus/0/history?since=1h&until=2h",
    ] {
        let (code, body) = c.get(path, None);
        assert_eq!(code, 200, "{path}: {body}");
        openapi::check(&spec, path, code, &serde_json::from_str(&body).unwrap()).unwrap_or_else(|e| panic!("{e}"));
    }
    // A node id of the longest length the document allows is a well-formed id: 404, not 400.
    let long = format!("/api/v1/nodes/{}", "n".repeat(128));
    assert_eq!(c.get(&long, None).0, 404);
    assert_eq!(c.get(&format!("{long}n"), None).0, 400);
    // The document states the time formats the handlers accept.
    let since = spec["paths"]["/api/v1/failures"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "since")
        .unwrap()
        .clone();
    assert_eq!(since["schema"]["anyOf"][0]["format"], "date-time", "{since}");
    assert_eq!(since["schema"]["anyOf"][1]["pattern"], "^([0-9]{1,9}[smhd])?$", "{since}");
    // Read-only: nothing but GET is routed.
    let (code, _) = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", c.http_port)).unwrap();
        write!(s, "DELETE /api/v1/nodes/healthy HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
        let mut b = String::new();
        s.read_to_string(&mut b).unwrap();
        (b.split_whitespace().nth(1).unwrap().parse::<u16>().unwrap(), b)
    };
    assert_eq!(code, 405);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_token_when_set_is_required() {
    let pg = TestPg::start().await;
    let d = tempfile::tempdir().unwrap();
    let tok = d.path().join("api-token");
    railguard_e2e::write_secret(&tok, "api-secret-0123456789\n");
    let c = CollectorProc::start_with(&pg.url(), &[], &["--api-token-file", tok.to_str().unwrap()]);
    assert_eq!(c.get("/api/v1/fleet", None).0, 401);
    assert_eq!(c.get("/api/v1/fleet", Some("wrong")).0, 401);
    assert_eq!(c.get("/api/v1/fleet", Some("api-secret-0123456789")).0, 200);
    assert_eq!(c.get("/metrics", None).0, 200, "metrics stay scrapeable");
    assert_eq!(c.get("/api/v1/openapi.json", None).0, 200);
}

/// Fleet reads that scale: the fleet's nodes in pages that neither repeat nor skip,
/// filtered by their worst status; failures limited; bad cursors refused.
#[tokio::test(flavor = "multi_thread")]
async fn the_fleet_is_read_in_pages() {
    let pg = TestPg::start().await;
    let c = scripted_fleet(&pg).await;
    let all = json(&c, "/api/v1/fleet");
    let everyone: Vec<&str> = all["nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap()).collect();
    assert_eq!(everyone.len(), 5);
    assert!(all["next"].is_null());
    // The per-node counts the page reads (kept by the assessment) agree with the GPUs' statuses.
    let counted: Vec<(String, i64, i64, Option<String>)> = sqlx::query_as(
        "SELECT n.node_id, count(g.gpu_index), count(*) FILTER (WHERE g.status = 'corrupting'), max(g.status)::text
         FROM nodes n LEFT JOIN gpu_status g ON g.node_id = n.node_id GROUP BY n.node_id",
    )
    .fetch_all(&pg.pool)
    .await
    .unwrap();
    for (node, gpus, corrupting, worst) in &counted {
        let n = all["nodes"].as_array().unwrap().iter().find(|n| n["node"] == node.as_str()).unwrap();
        assert_eq!(
            (&n["gpus"], &n["status_counts"]["corrupting"]),
            (&Value::from(*gpus), &Value::from(*corrupting)),
            "{n}"
        );
        assert_eq!(n["worst"].as_str(), worst.as_deref(), "{n}");
    }
    let total: i64 = counted.iter().map(|c| c.1).sum();
    assert_eq!(all["totals"]["gpus"], total);
    let mut paged = Vec::new();
    let mut url = "/api/v1/fleet?limit=2".to_owned();
    loop {
        let page = json(&c, &url);
        assert!(page["nodes"].as_array().unwrap().len() <= 2);
        paged.extend(page["nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap().to_owned()));
        assert_eq!(page["totals"], all["totals"], "totals are the fleet's on every page");
        match page["next"].as_str() {
            Some(n) => url = format!("/api/v1/fleet?limit=2&after={}", n.replace('|', "%7C")),
            None => break,
        }
    }
    assert_eq!(paged, everyone, "pages in the same order, nothing repeated or skipped");
    let bad = json(&c, "/api/v1/fleet?status=corrupting");
    let names: Vec<&str> = bad["nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap()).collect();
    assert_eq!(names, ["seed-auto", "seed-pinned"]);
    for q in ["after=nonsense", "after=9%7Cx", "after=4%7C%2Fetc", "limit=0", "status=broken"] {
        let (code, body) = c.get(&format!("/api/v1/fleet?{q}"), None);
        assert_eq!(code, 400, "{q}: {body}");
        assert!(serde_json::from_str::<Value>(&body).unwrap()["error"].is_string());
    }
    let f = json(&c, "/api/v1/failures?since=1d&limit=1");
    assert_eq!(f["failures"].as_array().unwrap().len(), 1);
}

/// The grid filtered, counted and paged by the collector: each filter leaves exactly the cells
/// it names (checked against the whole grid), the totals count them over every page, the pages
/// go worst first and neither repeat nor skip a cell, the changes are the left GPUs' only; a
/// filter outside what the document allows is a 400.
#[tokio::test(flavor = "multi_thread")]
async fn the_grid_is_filtered_counted_and_paged_by_the_collector() {
    let pg = TestPg::start().await;
    let c = scripted_fleet(&pg).await;
    let all = json(&c, "/api/v1/grid");
    let cells = all["cells"].as_array().unwrap().clone();
    assert_eq!((cells.len(), &all["totals"]["gpus"], &all["nodes"]), (40, &Value::from(40), &Value::from(5)), "{all}");
    assert!(all["next"].is_null());
    // A cell carries its first reason cut to 120 characters; the GPU's own route has it whole.
    let reason = |c: &Value| c["reason"].as_str().unwrap().to_owned();
    assert!(cells.iter().all(|c| reason(c).chars().count() <= 121), "{all}");
    let cut = cells.iter().find(|c| reason(c).ends_with('…')).expect("the seed's structural reason is longer");
    let whole = json(&c, &format!("/api/v1/nodes/{}/gpus/{}", cut["node"].as_str().unwrap(), cut["gpu"]));
    let first = whole["status"]["reasons"][0].as_str().unwrap();
    assert!(first.len() > reason(cut).len() && first.starts_with(reason(cut).trim_end_matches('…')), "{whole}");
    let key = |c: &Value| (c["node"].as_str().unwrap().to_owned(), c["gpu"].as_i64().unwrap());
    // What each filter leaves, by its definition.
    type Keep = fn(&Value) -> bool;
    let filters: [(&str, Keep); 11] = [
        ("status=corrupting", |c| c["status"] == "corrupting"),
        ("status=unverified", |c| c["verification"] == "unproven" || c["verification"] == "unprobed"),
        ("nic=mlx5_0", |c| c["workload_nic"] == "mlx5_0"),
        ("nic=mlx5", |c| c["workload_nic"] == "mlx5"),
        ("hv=none", |c| c["hypervisor"] == ""),
        ("hv=QEMU", |c| c["hypervisor"].as_str().unwrap().to_lowercase().contains("qemu")),
        ("model=h100", |c| c["gpu_model"].as_str().unwrap().to_lowercase().contains("h100")),
        ("q=SEED", |c| c["node"].as_str().unwrap().contains("seed")),
        ("q=pinned&nic=mlx5_0", |c| c["node"].as_str().unwrap().contains("pinned") && c["workload_nic"] == "mlx5_0"),
        ("hv=qemu&status=corrupting", |c| {
            c["hypervisor"].as_str().unwrap().to_lowercase().contains("qemu") && c["status"] == "corrupting"
        }),
        ("model=no-such-gpu", |_| false),
    ];
    let rank = |s: &str| ["ok", "watch", "unknown", "at_risk", "corrupting"].iter().position(|x| *x == s).unwrap();
    for (q, keep) in filters {
        let want: Vec<&Value> = cells.iter().filter(|c| keep(c)).collect();
        let got = json(&c, &format!("/api/v1/grid?{q}"));
        let got_cells = got["cells"].as_array().unwrap();
        let mut a: Vec<_> = got_cells.iter().map(key).collect();
        let mut b: Vec<_> = want.iter().map(|c| key(c)).collect();
        a.sort();
        b.sort();
        assert_eq!(a, b, "{q}");
        let n = |s: &str| want.iter().filter(|c| c["status"] == s).count();
        let t = &got["totals"];
        assert_eq!(t["gpus"], want.len(), "{q}: {t}");
        for s in ["ok", "watch", "unknown", "at_risk", "corrupting"] {
            assert_eq!(t[s], n(s), "{q}: {s} {t}");
        }
        let nodes: std::collections::BTreeSet<_> = want.iter().map(|c| c["node"].as_str().unwrap()).collect();
        assert_eq!(got["nodes"], nodes.len(), "{q}");
        // Worst first: a node's worst left cell never ranks above the one before's.
        let mut worst: Vec<(String, usize)> = Vec::new();
        for c in got_cells {
            let (node, r) = (c["node"].as_str().unwrap().to_owned(), rank(c["status"].as_str().unwrap()));
            match worst.last_mut() {
                Some((n, w)) if *n == node => *w = (*w).max(r),
                _ => worst.push((node, r)),
            }
        }
        assert!(worst.windows(2).all(|w| w[0].1 >= w[1].1), "{q}: {worst:?}");
        let left: std::collections::BTreeSet<_> = got_cells.iter().map(key).collect();
        for ch in got["changes_last_hour"].as_array().unwrap() {
            assert!(left.contains(&key(ch)), "{q}: a change of a GPU the filter did not leave: {ch}");
        }
        let page_nodes: Vec<&str> =
            got["page_nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap()).collect();
        assert_eq!(page_nodes, worst.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), "{q}");
        // Two nodes a page: the same cells in the same order, the totals on every page.
        let mut paged = Vec::new();
        let mut url = format!("/api/v1/grid?{q}&limit=2");
        loop {
            let page = json(&c, &url);
            assert!(page["page_nodes"].as_array().unwrap().len() <= 2, "{q}");
            assert_eq!((&page["totals"], &page["nodes"]), (&got["totals"], &got["nodes"]), "{q}");
            paged.extend(page["cells"].as_array().unwrap().iter().map(key));
            match page["next"].as_str() {
                Some(n) => url = format!("/api/v1/grid?{q}&limit=2&after={}", n.replace('|', "%7C")),
                None => break,
            }
        }
        assert_eq!(paged, got_cells.iter().map(key).collect::<Vec<_>>(), "{q}: pages neither repeat nor skip");
    }
    // Only what the document allows.
    for q in
        ["status=melting", "nic=a%20b", "q=%3Cscript%3E", "model=x%00", "hv=%1B%5B31m", "limit=0", "after=nonsense"]
    {
        let (code, body) = c.get(&format!("/api/v1/grid?{q}"), None);
        assert_eq!(code, 400, "{q}: {body}");
        assert!(serde_json::from_str::<Value>(&body).unwrap()["error"].is_string(), "{q}: {body}");
    }
}

/// Incremental writes: a pass over an unchanged fleet rewrites no GPU row (their
/// `assessed_at` stays), while the passes go on (`assessment_runs`).
#[tokio::test(flavor = "multi_thread")]
async fn an_unchanged_fleet_rewrites_no_status_row() {
    let pg = TestPg::start().await;
    let _c = scripted_fleet(&pg).await;
    let rows = |pool: sqlx::PgPool| async move {
        sqlx::query_as::<_, (String, i32, chrono::DateTime<chrono::Utc>)>(
            "SELECT node_id, gpu_index, assessed_at FROM gpu_status ORDER BY 1, 2",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let last = |pool: sqlx::PgPool| async move {
        sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>("SELECT finished_at FROM assessment_runs")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let (before, pass_before) = (rows(pg.pool.clone()).await, last(pg.pool.clone()).await);
    assert_eq!(before.len(), 40);
    // Passes begun after the rows were read, over the same fleet.
    _c.wait_for_a_later_pass();
    _c.wait_for_a_later_pass();
    let (after, pass_after) = (rows(pg.pool.clone()).await, last(pg.pool.clone()).await);
    assert!(pass_after > pass_before, "the assessment kept running");
    assert_eq!(before, after, "no row rewritten");
    // The API names both times for what they are: when the GPU's evidence last changed (the
    // row's time, unchanged) and when its node was last assessed (moving with the passes).
    let (code, body) = _c.get("/api/v1/nodes/healthy/gpus/0", None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let gpu = if v["status"].is_object() { &v["status"] } else { &v };
    let changed: chrono::DateTime<chrono::Utc> = gpu["changed_at"].as_str().unwrap().parse().unwrap();
    let assessed: chrono::DateTime<chrono::Utc> = gpu["assessed_at"].as_str().unwrap().parse().unwrap();
    let row = after.iter().find(|r| r.0 == "healthy" && r.1 == 0).unwrap();
    assert_eq!(changed, row.2, "{body}");
    assert!(assessed > changed, "the node was assessed after its GPU's evidence last changed: {body}");
}
