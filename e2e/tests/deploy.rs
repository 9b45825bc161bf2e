//! The systemd units' command lines, run as written (binary paths and Environment= values
//! substituted for this test's): the collector unit with its private Postgres, the agent unit
//! against it over TLS (certificates made for the test), until the node's topology is stored and served.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use railguard_agent::topology::fixture;
use railguard_e2e::*;

/// The unit's ExecStart as argv, with `${VAR}` from Environment= lines, overridden by `env`;
/// and those variables, which systemd also gives the process as its environment.
fn exec_start(unit: &str, env: &HashMap<&str, String>) -> (Vec<String>, HashMap<String, String>) {
    let text = std::fs::read_to_string(format!("{}/../deploy/systemd/{unit}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let mut vars: HashMap<String, String> = HashMap::new();
    for line in text.lines() {
        if let Some(kv) = line.strip_prefix("Environment=") {
            let (k, v) = kv.split_once('=').unwrap();
            vars.insert(k.to_owned(), v.to_owned());
        }
    }
    for (k, v) in env {
        vars.insert((*k).to_owned(), v.clone());
    }
    let exec = text.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
    let argv = exec
        .split_whitespace()
        .map(|w| {
            let mut w = w.to_owned();
            for (k, v) in &vars {
                w = w.replace(&format!("${{{k}}}"), v);
            }
            assert!(!w.contains("${"), "unset variable in {unit}: {w}");
            match w.strip_prefix("/usr/local/bin/") {
                Some(name) => bin(name).display().to_string(),
                None => w,
            }
        })
        .collect();
    (argv, vars)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_systemd_units_run_as_written() {
    let dir = tempfile::Builder::new().prefix("railguard-units-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let creds = dir.path().join("credentials");
    railguard_e2e::write_secret(&creds, format!("node-a {TOKEN_A}\n"));
    let token = dir.path().join("token");
    railguard_e2e::write_secret(&token, TOKEN_A);
    fixture::seed_kvm_guest().write(&dir.path().join("node")).unwrap();
    let (grpc, http) = (free_port(), free_port());
    // The units speak TLS: certificates for this test in place of /etc/railguard's.
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    railguard_e2e::certs::server_and_client(&certs);
    let cert = |f: &str| certs.join(f).display().to_string();

    let (argv, vars) = exec_start(
        "railguard-collector.service",
        &HashMap::from([
            ("RAILGUARD_GRPC_LISTEN", format!("127.0.0.1:{grpc}")),
            ("RAILGUARD_HTTP_LISTEN", format!("127.0.0.1:{http}")),
            ("RAILGUARD_DATA_DIR", dir.path().join("collector").display().to_string()),
            ("RAILGUARD_CREDENTIALS", creds.display().to_string()),
            ("RAILGUARD_TLS_CERT", cert("server.pem")),
            ("RAILGUARD_TLS_KEY", cert("server.key")),
        ]),
    );
    let mut collector = Command::new(&argv[0])
        .args(&argv[1..])
        .envs(&vars)
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_port(grpc);
    wait_for_port(http);

    let (argv, vars) = exec_start(
        "railguard-agent.service",
        &HashMap::from([
            ("RAILGUARD_COLLECTOR", format!("https://127.0.0.1:{grpc}")),
            ("RAILGUARD_CA_FILE", cert("ca.pem")),
            ("RAILGUARD_TOKEN_FILE", token.display().to_string()),
            ("RAILGUARD_SPOOL_DIR", dir.path().join("spool").display().to_string()),
            ("RAILGUARD_SYSFS_ROOT", dir.path().join("node/sys").display().to_string()),
        ]),
    );
    let mut agent = Command::new(&argv[0])
        .args(&argv[1..])
        .envs(&vars)
        .env("RAILGUARD_NODE_ID", "node-a") // what /etc/railguard/agent.env would set
        .env("RAILGUARD_PROBE_CYCLE", "0")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait::until("the agent unit's topology to reach the collector unit", Duration::from_secs(90), || {
        let (code, body) = http_get(http, "/api/v1/nodes/node-a", None);
        if code == 200 && body.contains("\"bdf\"") && body.matches("\"index\"").count() == 8 {
            Ok(())
        } else {
            Err(format!("{code} {body}"))
        }
    });
    kill(Pid::from_raw(agent.id() as i32), Signal::SIGTERM).unwrap();
    assert!(wait_exit(&mut agent, Duration::from_secs(30)).success());
    kill(Pid::from_raw(collector.id() as i32), Signal::SIGTERM).unwrap();
    assert!(
        wait_exit(&mut collector, Duration::from_secs(60)).success(),
        "the collector stops its Postgres and exits cleanly"
    );
    assert!(!dir.path().join("collector/postgres/postmaster.pid").exists(), "private Postgres stopped");
}

/// `kubectl kustomize DIR`, as JSON documents (through python3's yaml: no YAML crate here).
fn kustomize(dir: &str) -> Vec<serde_json::Value> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("kubectl").arg("kustomize").arg(root.join(dir)).output().expect("kubectl (Debian's)");
    assert!(out.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&out.stderr));
    let mut py = Command::new("python3")
        .args(["-c", "import sys, yaml, json; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    py.stdin.take().unwrap().write_all(&out.stdout).unwrap();
    let json = py.wait_with_output().unwrap();
    assert!(json.status.success());
    serde_json::from_slice(&json.stdout).unwrap()
}

fn doc<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn env_of<'a>(container: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    container["env"].as_array()?.iter().find(|e| e["name"] == name)?["value"].as_str()
}

/// The Kubernetes package: the base (`deploy/k8s`) and the example overlay
/// (`deploy/kustomize/example`) render with `kubectl kustomize`, every built-in object is valid
/// for Kubernetes 1.30 (kubernetes-validate, strict), and every value the overlay sets lands:
/// image tag, replicas, the dashboard and runbook addresses and Host names as the settings the
/// collector really reads, priorities, where agents run, the NetworkPolicy, and a ServiceMonitor
/// that scrapes HTTPS with the collector's CA.
#[test]
fn the_kustomize_package_renders_validates_and_carries_its_values() {
    let help = Command::new(bin("railguard-collector")).args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    for (dir, replicas) in [("deploy/k8s", 2), ("deploy/kustomize/example", 3)] {
        let docs = kustomize(dir);
        let tmp = tempfile::tempdir().unwrap();
        let mut files = Vec::new();
        for (i, d) in docs.iter().enumerate() {
            if d["apiVersion"].as_str().unwrap().contains("monitoring.coreos.com") {
                continue; // the operator's CRD: checked by its fields below
            }
            let f = tmp.path().join(format!("{i}.json"));
            std::fs::write(&f, d.to_string()).unwrap();
            files.push(f);
        }
        let out = Command::new("kubernetes-validate").args(["--strict", "-k", "1.30.0"]).args(&files).output().unwrap();
        assert!(
            out.status.success(),
            "{dir}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let collector = doc(&docs, "Deployment", "collector");
        assert_eq!(collector["spec"]["replicas"], replicas, "{dir}");
        let c = &collector["spec"]["template"]["spec"]["containers"][0];
        assert!(c["image"].as_str().unwrap().ends_with(":0.1.0"), "{dir}: {}", c["image"]);
        assert_eq!(c["envFrom"][0]["secretRef"]["name"], "database", "{dir}: the database URL kept");
        for e in c["env"].as_array().unwrap() {
            let name = e["name"].as_str().unwrap();
            assert!(help.contains(&format!("env: {name}")), "{dir}: {name} is no setting of `serve`");
        }
        if dir == "deploy/kustomize/example" {
            assert_eq!(env_of(c, "RAILGUARD_DASHBOARD_URL"), Some("https://railguard.example.com/"));
            assert_eq!(env_of(c, "RAILGUARD_RUNBOOK_URL"), Some("https://wiki.example.com/railguard/"));
            assert!(env_of(c, "RAILGUARD_HTTP_ALLOWED_HOSTS").unwrap().starts_with("railguard.example.com,"));
            assert_eq!(collector["spec"]["template"]["spec"]["priorityClassName"], "system-cluster-critical");
            let agent = &doc(&docs, "DaemonSet", "agent")["spec"]["template"]["spec"];
            assert_eq!(agent["priorityClassName"], "system-node-critical");
            assert_eq!(agent["nodeSelector"]["nvidia.com/gpu.present"], "true");
            assert_eq!(agent["nodeSelector"]["node-role.example.com/inference"], "true");
            let np = doc(&docs, "NetworkPolicy", "collector");
            let ports: Vec<i64> = np["spec"]["ingress"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r["ports"].as_array().unwrap().iter().map(|p| p["port"].as_i64().unwrap()))
                .collect();
            assert_eq!(ports, [7700, 7701]);
            let sm = doc(&docs, "ServiceMonitor", "railguard-collector");
            let ep = &sm["spec"]["endpoints"][0];
            assert_eq!((ep["port"].as_str(), ep["scheme"].as_str()), (Some("http"), Some("https")));
            assert_eq!(ep["tlsConfig"]["ca"]["configMap"]["name"], "collector-ca");
            let service = doc(&docs, "Service", "collector");
            assert_eq!(sm["spec"]["selector"]["matchLabels"], service["metadata"]["labels"], "it selects the Service");
        } else {
            assert_eq!(env_of(c, "RAILGUARD_DASHBOARD_URL"), Some("https://127.0.0.1:7701/"));
            assert!(docs.iter().all(|d| d["kind"] != "NetworkPolicy"), "the base leaves the network to the overlay");
        }
    }
}
