//! The alert rules in deploy/prometheus/ pass `promtool check rules` and their unit tests
//! (`promtool test rules`, Debian's prometheus package); the live collector's /metrics passes
//! `promtool check metrics` (Prometheus naming conventions).
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Stdio};

use railguard_e2e::*;

fn promtool(args: &[&str], dir: &std::path::Path, stdin: Option<&str>) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/setup.sh installs Debian's prometheus package)");
    child.stdin.take().unwrap().write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn the_alert_rules_check_and_pass_their_unit_tests() {
    let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus"));
    let (ok, out) = promtool(&["check", "rules", "railguard-alerts.yml"], dir, None);
    assert!(ok && out.contains("SUCCESS: 10 rules found"), "{out}");
    let (ok, out) = promtool(&["test", "rules", "railguard-alerts.test.yml"], dir, None);
    assert!(ok && out.contains("SUCCESS"), "{out}");
}

/// Every alert links its runbook, in this repository, to a section that exists; and its
/// dashboard page.
#[test]
fn every_alert_links_a_runbook_section_that_exists() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/railguard-alerts.yml")).unwrap();
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let repo = cargo.lines().find_map(|l| l.strip_prefix("repository = ")).unwrap().trim_matches('"');
    let mut alerts = 0;
    for block in rules.split("- alert: ").skip(1) {
        alerts += 1;
        let name = block.split_whitespace().next().unwrap();
        let field = |k: &str| {
            block
                .lines()
                .find_map(|l| l.trim().strip_prefix(k))
                .unwrap_or_else(|| panic!("{name} has no {k}"))
                .trim()
                .trim_matches('"')
                .to_owned()
        };
        // The runbooks' base is the collector's (railguard_collector_info's runbook_url: by
        // default this repository's docs/), then the file and section.
        let url = field("runbook_url:");
        let rest = url
            .strip_prefix(
                r#"{{ with query \"railguard_collector_info\" }}{{ . | first | label \"runbook_url\" }}{{ end }}"#,
            )
            .unwrap_or_else(|| panic!("{name}: {url}"));
        let (file, anchor) = rest.split_once('#').unwrap_or((rest, ""));
        let file = format!("docs/{file}");
        let doc = std::fs::read_to_string(root.join(&file)).unwrap_or_else(|e| panic!("{name}: {file}: {e}"));
        if !anchor.is_empty() {
            // GitHub's anchors: a heading, lower-cased, spaces as dashes, punctuation dropped.
            let slugs: Vec<String> = doc
                .lines()
                .filter_map(|l| l.strip_prefix("## "))
                .map(|h| {
                    h.to_lowercase()
                        .chars()
                        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                        .map(|c| if c == ' ' { '-' } else { c })
                        .collect()
                })
                .collect();
            assert!(slugs.iter().any(|s| s == anchor), "{name}: no section #{anchor} in {file}: {slugs:?}");
        }
        let dashboard = field("dashboard:");
        assert!(dashboard.contains("railguard_collector_info") && dashboard.contains("#/"), "{name}: {dashboard}");
    }
    assert_eq!(alerts, 10);
    assert_eq!(
        railguard_collector::http::dashboard_url::DashboardUrl::runbooks_default().as_str(),
        format!("{repo}/blob/main/docs/"),
        "the collector's default runbook base is this repository's docs/"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_collectors_metrics_follow_prometheus_conventions() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    // Some of everything: a node with probes and signals, so every family has samples.
    let dir = tempfile::tempdir().unwrap();
    let (spool, token) = filled_spool(dir.path(), 200);
    let mut agent = agent_ship(&collector.url(), &spool, &token, 100);
    assert!(wait_exit(&mut agent, std::time::Duration::from_secs(60)).success());
    // The assessment age appears once the first fleet pass has finished (every second here, but
    // the agent may have shipped its 200 records sooner).
    let metrics = wait::until("the first fleet pass on /metrics", std::time::Duration::from_secs(60), || {
        let (code, metrics) = collector.get("/metrics", None);
        assert_eq!(code, 200);
        if metrics.contains("\nrailguard_assessment_age_seconds ") { Ok(metrics) } else { Err(metrics) }
    });
    assert!(metrics.contains("railguard_agent_clock_ahead_seconds{node=\"node-a\"}"), "{metrics}");
    let (ok, out) = promtool(&["check", "metrics"], dir.path(), Some(&metrics));
    assert!(ok, "promtool check metrics: {out}\n{metrics}");
}

/// A real Prometheus server (Debian's) on loopback, with railguard's rules, scraping a real
/// collector (and two more replicas on its database: all three scraped, each alert fires once
/// per GPU) that a real agent feeds from the simulated seed node (every PIX pair rejecting
/// DMA while the transport says success): `RailguardGPUCorrupting` fires for node-a's GPUs with
/// the NIC to pin in its labels and description; GPU3's resolves once its workload is pinned to
/// that NIC, and the rest once the fault is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_real_prometheus_fires_the_corrupting_alert_for_the_seed_node() {
    let pg = TestPg::start().await;
    // The runbooks where this deployment keeps them (an internal copy of docs/).
    const RUNBOOKS: &str = "https://runbooks.example/railguard/";
    let collector = CollectorProc::start_with(&pg.url(), &[], &["--runbook-url", RUNBOOKS]);
    // Two more replicas on the same database (the shipped deployment runs two, the example
    // install three); Prometheus scrapes all three, and each alert still fires once per GPU.
    // All link the same dashboard.
    let dashboard = format!("http://127.0.0.1:{}/", collector.http_port);
    let replica =
        CollectorProc::start_with(&pg.url(), &[], &["--dashboard-url", &dashboard, "--runbook-url", RUNBOOKS]);
    let third = CollectorProc::start_with(&pg.url(), &[], &["--dashboard-url", &dashboard, "--runbook-url", RUNBOOKS]);
    let dir = tempfile::tempdir().unwrap();
    let faults = dir.path().join("faults.json");
    std::fs::write(&faults, SEED_MODEL).unwrap();
    let flags = ["--fabric", "sim", "--probe-cycle-secs", "1", "--probe-bytes", "64K", "--no-signals"];
    let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(|a| a.as_ref()).collect();
    args.extend(["--faults".as_ref(), faults.as_os_str()]);
    // The workloads pick each GPU's pair (their UCX_NET_DEVICES): the test's own, in a process
    // tree no other process on the machine is part of.
    let ns = ProcNamespace::start();
    args.extend(["--discover-workloads".as_ref(), "--proc-root".as_ref(), ns.proc_root().as_os_str()]);
    let _agent = seed_agent(&collector, dir.path(), &args);
    let rules = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus/railguard-alerts.yml"))
        .canonicalize()
        .unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: railguard\n    static_configs:\n      - targets: ['127.0.0.1:{}', '127.0.0.1:{}', '127.0.0.1:{}']\n",
            rules.display(),
            collector.http_port,
            replica.http_port,
            third.http_port
        ),
    )
    .unwrap();
    let port = free_port();
    let _prometheus = KillOnDrop(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (scripts/setup.sh installs Debian's prometheus package)"),
    );
    wait_for_port(port);
    let alerts = |port: u16| -> (String, Vec<serde_json::Value>) {
        let (_, body) = http_get(port, "/api/v1/alerts", None);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let firing = v["data"]["alerts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|x| x["labels"]["alertname"] == "RailguardGPUCorrupting" && x["state"] == "firing")
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        (body, firing)
    };
    // GPU3 (PIX with mlx5_3): its workload NIC and the verified NIC to pin ride on the alert.
    // Every GPU's PIX pair fails: all 8 fire, GPU3's with its pin.
    let firing = wait::until(
        "RailguardGPUCorrupting for 8 GPUs, GPU3's with a pin",
        std::time::Duration::from_secs(180),
        || {
            let (body, firing) = alerts(port);
            let pinned = firing.iter().any(|a| a["labels"]["gpu"] == "3" && a["labels"]["pin"].is_string());
            if pinned && firing.len() == 8 { Ok(firing) } else { Err(body) }
        },
    );
    // Three replicas scraped, one series per GPU: every rule evaluates (no duplicate series in
    // a join), and the fleet has 8 GPUs, not 24.
    let (_, rules_body) = http_get(port, "/api/v1/rules", None);
    let rules: serde_json::Value = serde_json::from_str(&rules_body).unwrap();
    for g in rules["data"]["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            assert_ne!(r["health"], "err", "{r}");
        }
    }
    let (_, count) = http_get(port, "/api/v1/query?query=count(railguard_gpu_info)", None);
    let count: serde_json::Value = serde_json::from_str(&count).unwrap();
    assert_eq!(count["data"]["result"][0]["value"][1], "8", "{count}");
    let a = firing.iter().find(|a| a["labels"]["gpu"] == "3").unwrap();
    assert_eq!(a["labels"]["node"], "node-a", "{a}");
    assert_eq!(a["labels"]["severity"], "critical", "{a}");
    assert_eq!(a["labels"]["workload_nic"], "mlx5_3", "{a}");
    let pin = a["labels"]["pin"].as_str().unwrap();
    assert!(pin.starts_with("mlx5_") && pin != "mlx5_3", "{a}");
    // The simulated fabric: the alert says so in its labels and its words.
    assert_eq!((&a["labels"]["verification"], &a["labels"]["path"]), (&"simulated".into(), &"simulated".into()), "{a}");
    assert_eq!(a["labels"]["pin_verified"], "false", "a pin verified on the simulated fabric only: {a}");
    assert_eq!(a["annotations"]["summary"], "GPU 3 on node-a corrupts KV-cache transfers (simulated fabric)", "{a}");
    // The alert links the GPU's page on this collector (its railguard_collector_info),
    // and that page is served.
    let page = format!("http://127.0.0.1:{}/#/node/node-a/gpu/3", collector.http_port);
    assert_eq!(a["annotations"]["dashboard"], page.as_str(), "{a}");
    assert_eq!(collector.get("/", None).0, 200);
    assert_eq!(collector.get("/api/v1/nodes/node-a/gpus/3", None).0, 200);
    assert_eq!(a["annotations"]["runbook_url"], format!("{RUNBOOKS}runbook-corrupting-gpu.md").as_str(), "{a}");
    let d = a["annotations"]["description"].as_str().unwrap();
    assert!(d.starts_with("On the simulated fabric (no hardware exercised)"), "{d}");
    assert!(d.contains(&format!("set UCX_NET_DEVICES={pin}:1 for its process (verified by simulated only)")), "{d}");

    // The Grafana dashboard (deploy/grafana/railguard.json): every query of every panel, its
    // annotation and its node variable returns series from this Prometheus.
    grafana_queries_return_data(port);

    // The pin applied: a workload process on GPU3 (it maps UCX, from the NIXL wheel) with
    // UCX_NET_DEVICES set to the NIC the alert names. The agent probes GPU3 through it, the pair
    // verifies, GPU3 leaves `corrupting` by the hysteresis, and its alert resolves; the other
    // GPUs' alerts keep firing.
    let (pin, firing_before) = {
        let (_, firing) = alerts(port);
        let pin =
            firing.iter().find(|a| a["labels"]["gpu"] == "3").unwrap()["labels"]["pin"].as_str().unwrap().to_owned();
        (pin, firing.len())
    };
    let capi = railguard_agent::probe::transport::nixl::locate::locate(None, &|k| std::env::var(k).ok()).unwrap();
    let libs = capi.parent().and_then(std::path::Path::parent).unwrap().join("nixl_cu12.libs");
    let ucp = std::fs::read_dir(&libs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("libucp-"))
        .unwrap();
    let _workload = ns.spawn(
        Spawn::new("python3")
            .args(["-c", "import ctypes, sys, time; ctypes.CDLL(sys.argv[1]); time.sleep(300)"])
            .arg(&ucp)
            .env("UCX_NET_DEVICES", format!("{pin}:1"))
            .env("CUDA_VISIBLE_DEVICES", "3"),
    );
    let (body, firing) =
        wait::until("GPU3's alert to resolve after the pin", std::time::Duration::from_secs(180), || {
            let (body, firing) = alerts(port);
            if !firing.is_empty() && firing.iter().all(|a| a["labels"]["gpu"] != "3") {
                Ok((body, firing))
            } else {
                Err(body)
            }
        });
    assert_eq!((firing_before, firing.len()), (8, 7), "only GPU3's alert resolved: {body}");

    // The fault goes away (the fabric repaired): every workload pair verifies again, and every
    // alert resolves.
    std::fs::write(&faults, r#"{"faults": []}"#).unwrap();
    wait::until("every RailguardGPUCorrupting to resolve", std::time::Duration::from_secs(180), || {
        let (body, firing) = alerts(port);
        if firing.is_empty() { Ok(()) } else { Err(body) }
    });
}

/// Runs each query of deploy/grafana/railguard.json against the Prometheus on `port`, with the
/// dashboard's variables as Grafana fills them (every node; a rate window of 30 s, this
/// server scraping every second), and requires series back. Waits (up to a minute) for rates
/// to have two samples and counters to move.
fn grafana_queries_return_data(port: u16) {
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/railguard.json")).unwrap(),
    )
    .unwrap();
    let queries: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_owned()))
        .collect();
    // Annotations mark moments (a GPU turning corrupting): asked over the last 10 minutes.
    let annotations: Vec<String> = dash["annotations"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["expr"].as_str().unwrap().to_owned())
        .collect();
    let variable = dash["templating"]["list"].as_array().unwrap().iter().find(|v| v["name"] == "node").unwrap();
    let nodes_query = variable["definition"].as_str().unwrap();
    assert_eq!(nodes_query, "label_values(railguard_gpu_status, node)");
    assert!(queries.len() >= 10 && !annotations.is_empty(), "{queries:?}");
    let encode = |q: &str| -> String {
        q.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    let ask = |path: &str, q: &str, extra: &str| -> serde_json::Value {
        let q = q.replace("$__rate_interval", "30s").replace("$node", ".*");
        let (_, body) = http_get(port, &format!("{path}?query={}{extra}", encode(&q)), None);
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("{q}: {body}"))
    };
    let run = |q: &str| ask("/api/v1/query", q, "");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    // The window ends a few seconds ahead: `now` is truncated to the second, and the first
    // corrupting sample may be younger than that second.
    let over_ten_minutes = format!("&start={}&end={}&step=1", now - 600, now + 5);
    for a in &annotations {
        let v = ask("/api/v1/query_range", a, &over_ten_minutes);
        assert_eq!(v["status"], "success", "{a}: {v}");
        assert!(v["data"]["result"].as_array().is_some_and(|r| !r.is_empty()), "annotation {a} marks nothing: {v}");
    }
    wait::until("every Grafana query to return data", std::time::Duration::from_secs(90), || {
        let empty: Vec<&String> = queries
            .iter()
            .filter(|q| {
                let v = run(q);
                assert_eq!(v["status"], "success", "{q}: {v}");
                v["data"]["result"].as_array().is_none_or(Vec::is_empty)
            })
            .collect();
        // The node variable's values: label_values() is Grafana's; its series query is this.
        let nodes = run("group by (node) (railguard_gpu_status)");
        let has_node =
            nodes["data"]["result"].as_array().is_some_and(|r| r.iter().any(|s| s["metric"]["node"] == "node-a"));
        if empty.is_empty() && has_node {
            Ok(())
        } else {
            Err(format!("queries without data: {empty:?} (node variable: {nodes})"))
        }
    });
}
