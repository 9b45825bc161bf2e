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
