//! What `deploy/` ships, run or rendered: the systemd units' command lines as written (binary
//! paths and Environment= values substituted for this test's), on this host and in the container
//! images podman builds from `deploy/container/`; the Kustomize package, rendered and validated.
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

/// Where a unit's command line runs: as this build's binary on this host, or in its container
/// image (`scripts/build-images.sh`), as the unit's user would.
enum Launch {
    Host,
    Image { tag: String, shared: std::path::PathBuf },
}

/// A container of the test's, removed however the test ends.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman").args(["rm", "-f", "-t", "0", &self.0]).output();
    }
}

impl Launch {
    /// Starts `argv` (its program one of the images' binaries) with `vars` and `env` as its
    /// environment. In an image the test's directory is mounted at its own path, so every path
    /// in the command line means the same file; the network is the host's (loopback only here).
    fn start(
        &self,
        what: &str,
        argv: &[String],
        vars: &HashMap<String, String>,
        env: &[(&str, &str)],
    ) -> (std::process::Child, Option<Container>) {
        let mut cmd = match self {
            Launch::Host => {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                c
            }
            Launch::Image { tag, shared } => {
                let name = format!("railguard-e2e-{what}-{}", std::process::id());
                let mut c = Command::new("podman");
                let nofile =
                    String::from_utf8(Command::new("sh").args(["-c", "ulimit -Hn"]).output().unwrap().stdout).unwrap();
                // As scripts/build-images.sh runs its checks: runc, and limits no higher than ours.
                c.args(["run", "--runtime", "runc", "--rm", "--network", "host", "--name", &name])
                    .args(["--ulimit", &format!("nofile={0}:{0}", nofile.trim()), "--ulimit", "nproc=4096:4096"])
                    .args(["-v", &format!("{0}:{0}", shared.display())]);
                for k in vars.keys().map(String::as_str).chain(env.iter().map(|(k, _)| *k)) {
                    c.args(["-e", k]); // the value from podman's own environment, not its argv
                }
                c.arg(format!("localhost/railguard-{what}:{tag}")).args(&argv[1..]);
                let container = Container(name);
                return (c.envs(vars).envs(env.iter().copied()).stdin(Stdio::null()).spawn().unwrap(), Some(container));
            }
        };
        (cmd.envs(vars).envs(env.iter().copied()).stdin(Stdio::null()).spawn().unwrap(), None)
    }
}

/// The collector unit with its private Postgres, the agent unit against it over TLS
/// (certificates made for the test), until the node's topology is stored and served; then both
/// stop on SIGTERM, the collector with its Postgres.
fn units_run_as_written(launch: &Launch, dir: &std::path::Path) {
    let creds = dir.join("credentials");
    railguard_e2e::write_secret(&creds, format!("node-a {TOKEN_A}\n"));
    let token = dir.join("token");
    railguard_e2e::write_secret(&token, TOKEN_A);
    fixture::seed_kvm_guest().write(&dir.join("node")).unwrap();
    let (grpc, http) = free_port_pair();
    // The units speak TLS: certificates for this test in place of /etc/railguard's.
    let certs = dir.join("certs");
    std::fs::create_dir(&certs).unwrap();
    railguard_e2e::certs::server_and_client(&certs);
    let cert = |f: &str| certs.join(f).display().to_string();
    if let Launch::Image { .. } = launch {
        // The collector's image runs it as user 65532: its secrets and data are that user's.
        std::fs::create_dir(dir.join("collector")).unwrap();
        for f in [creds.clone(), certs.join("server.key"), dir.join("collector")] {
            nix::unistd::chown(&f, Some(nix::unistd::Uid::from_raw(65532)), None).unwrap();
        }
    }

    let (argv, vars) = exec_start(
        "railguard-collector.service",
        &HashMap::from([
            ("RAILGUARD_GRPC_LISTEN", format!("127.0.0.1:{grpc}")),
            ("RAILGUARD_HTTP_LISTEN", format!("127.0.0.1:{http}")),
            ("RAILGUARD_DATA_DIR", dir.join("collector").display().to_string()),
            ("RAILGUARD_CREDENTIALS", creds.display().to_string()),
            ("RAILGUARD_TLS_CERT", cert("server.pem")),
            ("RAILGUARD_TLS_KEY", cert("server.key")),
        ]),
    );
    let (mut collector, _c) = launch.start("collector", &argv, &vars, &[("RUST_LOG", "warn")]);
    wait_for_port(grpc);
    wait_for_port(http);

    let (argv, vars) = exec_start(
        "railguard-agent.service",
        &HashMap::from([
            ("RAILGUARD_COLLECTOR", format!("https://127.0.0.1:{grpc}")),
            ("RAILGUARD_CA_FILE", cert("ca.pem")),
            ("RAILGUARD_TOKEN_FILE", token.display().to_string()),
            ("RAILGUARD_SPOOL_DIR", dir.join("spool").display().to_string()),
            ("RAILGUARD_SYSFS_ROOT", dir.join("node/sys").display().to_string()),
        ]),
    );
    let (mut agent, _a) = launch.start(
        "agent",
        &argv,
        &vars,
        // RAILGUARD_NODE_ID: what /etc/railguard/agent.env would set
        &[("RAILGUARD_NODE_ID", "node-a"), ("RAILGUARD_PROBE_CYCLE", "0"), ("RUST_LOG", "warn")],
    );
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
    assert!(!dir.join("collector/postgres/postmaster.pid").exists(), "private Postgres stopped");
}

fn shared_dir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn the_systemd_units_run_as_written() {
    let dir = shared_dir("railguard-units-");
    units_run_as_written(&Launch::Host, dir.path());
}

/// Both images, built by podman from `deploy/container/` through `scripts/build-images.sh` (this
/// build's binaries; no registry), say their version, carry the entry points and user the
/// manifests rely on, and run the units' command lines: the agent's image ships its node's
/// topology to the collector's image, which runs its private Postgres as its own user.
#[test]
fn the_images_build_and_run_the_units() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tag = "e2e";
    let out = Command::new("bash")
        .arg(root.join("scripts/build-images.sh"))
        .args(["--profile", "debug", "--tag", tag])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "build-images: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    for what in ["agent", "collector"] {
        let here = Command::new(bin(&format!("railguard-{what}"))).arg("--version").output().unwrap();
        let version = String::from_utf8(here.stdout).unwrap();
        assert!(
            stdout.contains(&format!("localhost/railguard-{what}:{tag}: {}", version.trim())),
            "{what}'s image says another version than this build's {version}: {stdout}"
        );
    }
    let inspect = |what: &str| -> serde_json::Value {
        let out = Command::new("podman")
            .args(["image", "inspect", &format!("localhost/railguard-{what}:{tag}")])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()[0]["Config"].clone()
    };
    let agent = inspect("agent");
    assert_eq!(agent["Entrypoint"], serde_json::json!(["/usr/local/bin/railguard-agent"]));
    assert_eq!(agent["Cmd"], serde_json::json!(["run"]));
    let collector = inspect("collector");
    assert_eq!(collector["Entrypoint"], serde_json::json!(["/usr/local/bin/railguard-collector"]));
    assert_eq!(collector["User"], "65532", "the collector runs as a user of its own, not root");

    let dir = shared_dir("railguard-images-");
    units_run_as_written(&Launch::Image { tag: tag.into(), shared: dir.path().to_owned() }, dir.path());
}

/// A YAML stream as JSON documents (through python3's yaml: no YAML crate here).
fn yaml_documents(what: &str, yaml: &[u8]) -> Vec<serde_json::Value> {
    let mut py = Command::new("python3")
        .args(["-c", "import sys, yaml, json; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    py.stdin.take().unwrap().write_all(yaml).unwrap();
    let json = py.wait_with_output().unwrap();
    assert!(json.status.success(), "{what}: not YAML");
    serde_json::from_slice(&json.stdout).unwrap()
}

fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `kubectl kustomize DIR`, as JSON documents.
fn kustomize(dir: &str) -> Vec<serde_json::Value> {
    let out = Command::new("kubectl").arg("kustomize").arg(repo().join(dir)).output().expect("kubectl (Debian's)");
    assert!(out.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&out.stderr));
    yaml_documents(dir, &out.stdout)
}

/// `deploy/helm/railguard` rendered by Helm's own engine (`scripts/helm_template.py`, the
/// helm-python-sdk environment setup.sh makes) with `values` files, release `railguard` in
/// namespace `railguard`, as JSON documents.
fn helm_template(values: &[&str]) -> Vec<serde_json::Value> {
    let python = setup_env("helm").join("bin/python");
    assert!(python.exists(), "{} is missing: run scripts/setup.sh", python.display());
    let mut cmd = Command::new(python);
    cmd.arg(repo().join("scripts/helm_template.py")).arg(repo().join("deploy/helm/railguard"));
    for v in values {
        cmd.arg("-f").arg(repo().join(v));
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "helm template {values:?}: {}", String::from_utf8_lossy(&out.stderr));
    yaml_documents("helm template", &out.stdout)
}

fn doc<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn env_of<'a>(container: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    container["env"].as_array()?.iter().find(|e| e["name"] == name)?["value"].as_str()
}

/// Every built-in object of `docs` is valid for Kubernetes 1.30 (kubernetes-validate, strict);
/// the Prometheus Operator's are checked by their fields.
fn validate(what: &str, docs: &[serde_json::Value]) {
    let tmp = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        if d["apiVersion"].as_str().unwrap().contains("monitoring.coreos.com") {
            continue;
        }
        let f = tmp.path().join(format!("{i}.json"));
        std::fs::write(&f, d.to_string()).unwrap();
        files.push(f);
    }
    let out = Command::new("kubernetes-validate").args(["--strict", "-k", "1.30.0"]).args(&files).output().unwrap();
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What an install's values must do, whichever package renders them: the release's images, the
/// replicas, the database Secret, only settings the binaries know (environment and flags), and
/// for the example install its dashboard and runbook addresses, Host names, priorities, where
/// agents run, the NetworkPolicy's ports and a ServiceMonitor scraping HTTPS with the CA.
fn check_install(what: &str, docs: &[serde_json::Value], example: bool) {
    let help = |bin_name: &str, sub: &str| {
        let out = Command::new(bin(bin_name)).args([sub, "--help"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (serve, run) = (help("railguard-collector", "serve"), help("railguard-agent", "run"));
    let collector = doc(docs, "Deployment", "collector");
    assert_eq!(collector["spec"]["replicas"], if example { 3 } else { 2 }, "{what}");
    let c = &collector["spec"]["template"]["spec"]["containers"][0];
    assert!(c["image"].as_str().unwrap().ends_with("/railguard-collector:0.1.0"), "{what}: {}", c["image"]);
    assert_eq!(c["envFrom"][0]["secretRef"]["name"], "database", "{what}: the database URL kept");
    for e in c["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap();
        assert!(serve.contains(&format!("env: {name}")), "{what}: {name} is no setting of `serve`");
    }
    let agent_pod = &doc(docs, "DaemonSet", "agent")["spec"]["template"]["spec"];
    let a = &agent_pod["containers"][0];
    assert!(a["image"].as_str().unwrap().ends_with("/railguard-agent:0.1.0"), "{what}: {}", a["image"]);
    for (args, usage, sub) in [(&c["args"], &serve, "serve"), (&a["args"], &run, "run")] {
        for flag in args.as_array().unwrap().iter().filter_map(|a| a.as_str()?.strip_prefix("--")) {
            let flag = flag.split('=').next().unwrap();
            assert!(
                usage.contains(&format!("--{flag} ")) || usage.contains(&format!("--{flag}\n")),
                "{what}: --{flag} is no flag of `{sub}`"
            );
        }
    }
    if example {
        assert_eq!(env_of(c, "RAILGUARD_DASHBOARD_URL"), Some("https://railguard.example.com/"));
        assert_eq!(env_of(c, "RAILGUARD_RUNBOOK_URL"), Some("https://wiki.example.com/railguard/"));
        assert!(env_of(c, "RAILGUARD_HTTP_ALLOWED_HOSTS").unwrap().starts_with("railguard.example.com,"));
        assert_eq!(collector["spec"]["template"]["spec"]["priorityClassName"], "system-cluster-critical");
        assert_eq!(agent_pod["priorityClassName"], "system-node-critical");
        assert_eq!(agent_pod["nodeSelector"]["nvidia.com/gpu.present"], "true");
        assert_eq!(agent_pod["nodeSelector"]["node-role.example.com/inference"], "true");
        let np = doc(docs, "NetworkPolicy", "collector");
        let ports: Vec<i64> = np["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["ports"].as_array().unwrap().iter().map(|p| p["port"].as_i64().unwrap()))
            .collect();
        assert_eq!(ports, [7700, 7701]);
        let sm = doc(docs, "ServiceMonitor", "railguard-collector");
        let ep = &sm["spec"]["endpoints"][0];
        assert_eq!((ep["port"].as_str(), ep["scheme"].as_str()), (Some("http"), Some("https")));
        assert_eq!(ep["tlsConfig"]["ca"]["configMap"]["name"], "collector-ca");
        assert_eq!(ep["tlsConfig"]["serverName"], "collector.railguard.svc");
        let service = doc(docs, "Service", "collector");
        for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(&service["metadata"]["labels"][k], v, "{what}: the ServiceMonitor selects the Service");
        }
    } else {
        assert_eq!(env_of(c, "RAILGUARD_DASHBOARD_URL"), Some("https://127.0.0.1:7701/"));
        assert!(docs.iter().all(|d| d["kind"] != "NetworkPolicy"), "{what}: the network is left to the install");
    }
}

/// The Kubernetes package: the base (`deploy/k8s`) and the example overlay
/// (`deploy/kustomize/example`) render with `kubectl kustomize`, validate, and carry the
/// install's values ([`check_install`]).
#[test]
fn the_kustomize_package_renders_validates_and_carries_its_values() {
    for (dir, example) in [("deploy/k8s", false), ("deploy/kustomize/example", true)] {
        let docs = kustomize(dir);
        validate(dir, &docs);
        check_install(dir, &docs, example);
    }
}

/// A pod spec without the fields only one package sets (Helm's pull policy).
fn pod_spec(d: &serde_json::Value) -> serde_json::Value {
    let mut spec = d["spec"]["template"]["spec"].clone();
    for c in spec["containers"].as_array_mut().unwrap() {
        c.as_object_mut().unwrap().remove("imagePullPolicy");
    }
    spec
}

/// The Helm chart (`deploy/helm/railguard`), rendered by Helm's own engine: its defaults and the
/// example values (`deploy/helm/example-values.yaml`, the same install as the Kustomize
/// example) validate and carry the install's values ([`check_install`]); at its defaults the
/// agent's and the collector's pods are the Kustomize base's, field for field; the switches
/// switch: DeviceTaintRules (the flags and their RBAC), the in-cluster Postgres, the agents'
/// PodMonitor.
#[test]
fn the_helm_chart_renders_validates_and_matches_the_kustomize_base() {
    let base = kustomize("deploy/k8s");
    let defaults = helm_template(&[]);
    validate("helm defaults", &defaults);
    check_install("helm defaults", &defaults, false);
    for (kind, name) in [("DaemonSet", "agent"), ("Deployment", "collector")] {
        assert_eq!(pod_spec(doc(&defaults, kind, name)), pod_spec(doc(&base, kind, name)), "{kind} {name}");
    }
    let kinds = |docs: &[serde_json::Value]| -> std::collections::BTreeSet<String> {
        docs.iter()
            .map(|d| format!("{} {}", d["kind"].as_str().unwrap(), d["metadata"]["name"].as_str().unwrap()))
            .collect()
    };
    let mut base_objects = kinds(&base);
    base_objects.remove("Namespace railguard"); // helm install --create-namespace
    assert_eq!(kinds(&defaults), base_objects);
    let rules = |docs: &[serde_json::Value]| doc(docs, "ClusterRole", "railguard-collector-nodes")["rules"].to_string();
    assert!(!rules(&defaults).contains("devicetaintrules"), "no DeviceTaintRule rights unless switched on");

    let example = helm_template(&["deploy/helm/example-values.yaml"]);
    validate("helm example", &example);
    check_install("helm example", &example, true);
    let args =
        doc(&example, "Deployment", "collector")["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("\"--k8s-device-taints\"") && args.contains("--k8s-device-taint-api=v1beta2"), "{args}");
    assert!(rules(&example).contains("devicetaintrules"));
    assert!(example.iter().all(|d| d["metadata"]["name"] != "postgres"), "postgres.enabled=false leaves it out");
    // The key set from a ConfigMap instead of the API server; the collector's image alone moved.
    let tmp = tempfile::tempdir().unwrap();
    let values = tmp.path().join("values.yaml");
    std::fs::write(&values, "collector:\n  jwksConfigMap: k8s-jwks\n  imageTag: \"0.2.0\"\n").unwrap();
    let from_file = helm_template(&[values.to_str().unwrap()]);
    validate("helm jwks from a ConfigMap", &from_file);
    let pod = &doc(&from_file, "Deployment", "collector")["spec"]["template"]["spec"];
    let args = pod["containers"][0]["args"].to_string();
    assert!(
        args.contains("--k8s-jwks=/etc/railguard/k8s/jwks.json") && !args.contains("--k8s-jwks-from-api"),
        "{args}"
    );
    assert!(pod["volumes"].to_string().contains("\"k8s-jwks\""), "{pod}");
    assert!(!rules(&from_file).contains("/openid/v1/jwks"), "no API right it does not use");
    assert!(rules(&defaults).contains("/openid/v1/jwks"));
    assert!(pod["containers"][0]["image"].as_str().unwrap().ends_with("/railguard-collector:0.2.0"));
    let agent_image = &doc(&from_file, "DaemonSet", "agent")["spec"]["template"]["spec"]["containers"][0]["image"];
    assert!(agent_image.as_str().unwrap().ends_with("/railguard-agent:0.1.0"), "{agent_image}");

    let pm = doc(&example, "PodMonitor", "railguard-agent");
    assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
    let agent = doc(&example, "DaemonSet", "agent");
    assert_eq!(
        pm["spec"]["selector"]["matchLabels"], agent["spec"]["selector"]["matchLabels"],
        "it selects the agents"
    );
}
