//! A highly available Postgres of a test's own: `scripts/pg-ha.sh` (etcd, three PostgreSQL
//! members under Patroni in synchronous mode, HAProxy, pgBackRest) in a temporary directory and
//! a port range below a free port, stopped (`pg-ha.sh down`) however the test ends. Its
//! passwords are remembered as secrets, so a test log that shows one fails
//! `scripts/check-test-logs.sh`.

use std::process::Command;

use crate::remember_secret;

fn pg_ha(args: &[&str], base: u16) -> String {
    try_pg_ha(args, base).unwrap_or_else(|e| panic!("pg-ha.sh {args:?}: {e}"))
}

/// `pg-ha.sh` with `args` on the ports from `base`: its standard output, or its standard error.
fn try_pg_ha(args: &[&str], base: u16) -> Result<String, String> {
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg-ha.sh"))
        .args(args)
        .env("PGHA_PORT_BASE", base.to_string())
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// How many ports from its base a cluster takes (`pg-ha.sh`: +0 to +40).
const PORTS: u16 = 41;

/// `pg-ha.sh down` when dropped: held from before `up` runs, so a failed start (a panic in `up`
/// or after it) stops whatever it started.
struct Running {
    cluster: String,
    base: u16,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg-ha.sh"))
            .args(["down", &self.cluster])
            .env("PGHA_PORT_BASE", self.base.to_string())
            .output();
    }
}

/// An HA cluster of the test's own, stopped however the test ends.
pub struct Ha {
    /// Dropped before the directory: the cluster stops, then its files go.
    running: Running,
    _dir: tempfile::TempDir,
    /// The cluster directory (`pg-ha.sh`'s DIR): members' data under `<member>/data`.
    pub cluster: String,
    /// Through HAProxy to the primary.
    pub write_url: String,
    /// Through HAProxy to the replicas.
    pub read_url: String,
    /// The collector role's password (the URLs carry none).
    pub password_file: String,
}

impl Ha {
    /// Starts a cluster (`pg-ha.sh up`) in a directory and port range of its own.
    pub fn up() -> Ha {
        let dir = tempfile::Builder::new().prefix("railguard-pgha-").tempdir().unwrap();
        // Postgres runs as an unprivileged user when tests run as root: let it in.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let cluster = dir.path().join("c").display().to_string();
        // A port range of our own. Free when picked, a port may still be taken before the cluster
        // binds it: then `up` stops what it started and says so, and another range is tried.
        let mut attempt = 0;
        let (running, out) = loop {
            let base = crate::free_ports(PORTS);
            let running = Running { cluster: cluster.clone(), base };
            match try_pg_ha(&["up", &cluster], base) {
                Ok(out) => break (running, out),
                Err(e) if e.to_lowercase().contains("address already in use") && attempt < 3 => {
                    attempt += 1;
                    drop(running);
                    let _ = std::fs::remove_dir_all(&cluster);
                }
                Err(e) => panic!("pg-ha.sh up {cluster}: {e}"),
            }
        };
        let field = |k: &str| out.lines().find_map(|l| l.strip_prefix(k)).unwrap().to_owned();
        let ha = Ha {
            write_url: field("write_url="),
            read_url: field("read_url="),
            password_file: field("password_file="),
            running,
            _dir: dir,
            cluster,
        };
        for s in ha.secrets() {
            remember_secret(&s);
        }
        ha
    }

    /// Every password of the cluster (`DIR/secrets`).
    pub fn secrets(&self) -> Vec<String> {
        ["superuser", "replication", "restapi", "etcd", "collector"]
            .iter()
            .map(|n| std::fs::read_to_string(format!("{}/secrets/{n}", self.cluster)).unwrap().trim().to_owned())
            .collect()
    }

    /// Member `i`'s Patroni REST port.
    pub fn rest_port(&self, i: u16) -> u16 {
        self.running.base + 20 + i
    }

    /// etcd's client port.
    pub fn etcd_port(&self) -> u16 {
        self.running.base
    }

    /// `curl -X METHOD https://127.0.0.1:PORT PATH` with `body`, verified against the cluster's
    /// CA: the HTTP status, or None when no HTTP answer came.
    pub fn https(&self, port: u16, method: &str, path: &str, body: &str) -> Option<u16> {
        let ca = ["--cacert".to_owned(), format!("{}/tls/ca.crt", self.cluster)];
        curl_status(&format!("https://127.0.0.1:{port}{path}"), method, body, &ca)
    }

    /// The same request in plain HTTP: the status, or None when no HTTP answer came.
    pub fn http(&self, port: u16, method: &str, path: &str, body: &str) -> Option<u16> {
        curl_status(&format!("http://127.0.0.1:{port}{path}"), method, body, &[])
    }

    /// The collector's flag for its password: `--database-password-file FILE`.
    pub fn password_args(&self) -> [&str; 2] {
        ["--database-password-file", &self.password_file]
    }

    /// Connection options for `url` (one of this cluster's) with the collector role's password.
    pub fn options(&self, url: &str) -> sqlx::postgres::PgConnectOptions {
        let pw = std::fs::read_to_string(&self.password_file).unwrap();
        url.parse::<sqlx::postgres::PgConnectOptions>().unwrap().password(pw.trim())
    }

    /// `pg-ha.sh <args[0]> DIR <args[1..]>`; its standard output.
    pub fn run(&self, args: &[&str]) -> String {
        let mut all = vec![args[0], &self.cluster];
        all.extend(&args[1..]);
        pg_ha(&all, self.running.base)
    }

    /// (leader member, its postmaster's pid).
    pub fn leader(&self) -> (String, i32) {
        let status = self.run(&["status"]);
        let leader = status.split_whitespace().find_map(|w| w.strip_prefix("leader=")).unwrap().to_owned();
        let pid = status.split_whitespace().find_map(|w| w.strip_prefix("pid=")).unwrap().parse().unwrap();
        (leader, pid)
    }
}

/// API reads of one collector, made every 200 ms on a thread of their own while a fault runs.
pub struct Reads {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<ReadsSeen>,
}

/// What [`Reads`] saw: how many answered 200, and what each other read got (status, body).
#[derive(Debug, Default)]
pub struct ReadsSeen {
    pub answered: usize,
    pub failed: Vec<String>,
}

impl Reads {
    /// GETs `path` on the collector's HTTP port until [`Reads::finish`].
    pub fn start(http_port: u16, path: &'static str) -> Reads {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut seen = ReadsSeen::default();
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                match crate::http_get(http_port, path, None) {
                    (200, _) => seen.answered += 1,
                    (status, body) => {
                        seen.failed.push(format!("{status} {}", body.chars().take(200).collect::<String>()))
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            seen
        });
        Reads { stop, handle }
    }

    pub fn finish(self) -> ReadsSeen {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().unwrap()
    }
}

/// curl's answer to one request: the HTTP status, or None when none came.
fn curl_status(url: &str, method: &str, body: &str, extra: &[String]) -> Option<u16> {
    let out = std::process::Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", "-X", method])
        .args(["-H", "Content-Type: application/json", "--data-binary", body])
        .args(extra)
        .arg(url)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok().filter(|c| *c != 0)
}
