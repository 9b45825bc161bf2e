//! Support for the end-to-end tests: a private Postgres per test, the real collector and agent
//! binaries as child processes, and record generators.
#![allow(clippy::unwrap_used)] // test support: a failed setup should fail the test loudly

pub mod browser;
pub mod ha;
pub mod history_seed;
pub mod modules;
pub mod needs;
pub mod openapi;
pub mod png;
pub mod readers;
pub mod schema;
pub mod scripted;

/// The one way tests wait ([`wait::until`]), and a process tree of a test's own.
pub use railguard_testkit::{KubeletClaim, KubeletPod, NsProcess, ProcNamespace, Spawn, kubelet_stand_in, wait};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use railguard_collector::store::pg::PrivateCluster;
use railguard_schema::*;
use sqlx::PgPool;

pub const TOKEN_A: &str = "token-for-node-a-0123456789";
pub const TOKEN_B: &str = "token-for-node-b-0123456789";

/// A throwaway Postgres cluster with one migrated database, stopped on drop.
pub struct TestPg {
    pub cluster: PrivateCluster,
    pub pool: PgPool,
    _dir: tempfile::TempDir,
}

impl TestPg {
    pub async fn start() -> TestPg {
        TestPg::start_at(None).await
    }

    /// A cluster that syncs every commit to disk, as the collector's own private Postgres does
    /// (the benchmarks' clusters); the suite's clusters skip fsync.
    pub async fn start_durable() -> TestPg {
        TestPg::start_with(None, true).await
    }

    /// A cluster whose database has the migrations up to `version` applied (all when None).
    pub async fn start_at(version: Option<i64>) -> TestPg {
        TestPg::start_with(version, false).await
    }

    async fn start_with(version: Option<i64>, durable: bool) -> TestPg {
        let dir = tempfile::Builder::new().prefix("railguard-pg-").tempdir().unwrap();
        // Postgres runs as an unprivileged user when tests run as root: let it in.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let data = dir.path().join("data");
        let cluster =
            tokio::task::spawn_blocking(move || PrivateCluster::start(&data, durable)).await.unwrap().unwrap();
        // Stopped if anything below fails: a failed start leaves no server running.
        let started = StopOnDrop(Some(cluster));
        let cluster = started.0.as_ref().unwrap();
        if let Ok(password) = std::fs::read_to_string(cluster.password_file()) {
            remember_secret(password.trim());
        }
        cluster.create_database("railguard").await.unwrap();
        let opts = cluster.connect_options("railguard");
        let pool = match version {
            None => railguard_collector::store::pg::connect_and_migrate(opts, 4).await.unwrap(),
            Some(v) => {
                let pool = sqlx::postgres::PgPoolOptions::new().max_connections(4).connect_with(opts).await.unwrap();
                railguard_collector::store::pg::MIGRATOR.run_to(v, &pool).await.unwrap();
                pool
            }
        };
        TestPg { cluster: started.keep(), pool, _dir: dir }
    }

    pub fn url(&self) -> String {
        self.cluster.url("railguard")
    }

    pub async fn count(&self, table: &str) -> i64 {
        let sql = match table {
            "probe_results" => "SELECT count(*) FROM probe_results",
            "probe_summary_sets" => "SELECT count(*) FROM probe_summary_sets",
            "signal_events" => "SELECT count(*) FROM signal_events",
            "topology_snapshots" => "SELECT count(*) FROM topology_snapshots",
            "topology_nics" => "SELECT count(*) FROM topology_nics",
            "nodes" => "SELECT count(*) FROM nodes",
            "rollup_hours" => "SELECT count(*) FROM rollup_hours",
            "assessment_runs" => "SELECT count(*) FROM assessment_runs",
            _ => panic!("unknown table {table}"),
        };
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    /// Rows in the history tables, and distinct record ids among them.
    pub async fn stored_and_distinct(&self) -> (i64, i64) {
        sqlx::query_as(
            "SELECT count(*), count(DISTINCT record_id) FROM (
                SELECT record_id FROM probe_results UNION ALL
                SELECT record_id FROM probe_summary_sets UNION ALL
                SELECT record_id FROM signal_events WHERE kind <> 'agent_spool_drops' UNION ALL
                SELECT record_id FROM topology_snapshots) r",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }
}

/// A private cluster stopped when dropped, until [`StopOnDrop::keep`] hands it on.
struct StopOnDrop(Option<PrivateCluster>);

impl StopOnDrop {
    fn keep(mut self) -> PrivateCluster {
        self.0.take().unwrap()
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            let _ = c.stop();
        }
    }
}

impl Drop for TestPg {
    fn drop(&mut self) {
        let _ = self.cluster.stop();
    }
}

/// Writes a secret file (a token, credentials) as the binaries require it: 0600. Each secret in
/// it (a line's last word: the token of `NODE TOKEN`) is remembered ([`remember_secret`]).
pub fn write_secret(path: &Path, contents: impl AsRef<[u8]>) {
    use std::os::unix::fs::PermissionsExt;
    let contents = contents.as_ref();
    for line in String::from_utf8_lossy(contents).lines() {
        if let Some(secret) = line.split_whitespace().last() {
            remember_secret(secret);
        }
    }
    std::fs::write(path, contents).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Adds `secret` to target/test-secrets.txt (0600, one per line): after the suite,
/// scripts/check-test-logs.sh fails the run if any of them appears in any test's output.
pub fn remember_secret(secret: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if secret.len() < 8 {
        return;
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-secrets.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path) {
        // One write per line: appends from concurrent tests never interleave within a line.
        let _ = f.write_all(format!("{secret}\n").as_bytes());
    }
}

/// Path of a workspace binary next to the test executable (`cargo test --workspace` builds them).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/debug/deps/<test> for a test, target/debug/<bin> for a binary (the chaos suite).
    let deps = exe.parent().unwrap();
    let dir = if deps.join(name).exists() { deps } else { deps.parent().unwrap() };
    let path = dir.join(name);
    assert!(path.exists(), "{} is missing: build the workspace first (`cargo build --workspace`)", path.display());
    path
}

/// A port on 127.0.0.1 free now: [`free_ports`] for one.
pub fn free_port() -> u16 {
    free_ports(1)
}

/// Two ports on 127.0.0.1 free now, never the same one (a collector's gRPC and HTTP
/// listeners): [`free_ports`] for two in a row.
pub fn free_port_pair() -> (u16, u16) {
    let first = free_ports(2);
    (first, first + 1)
}

/// The first of `n` consecutive ports on 127.0.0.1 free now, below the kernel's range for
/// ephemeral ports (where every test's own connections and `127.0.0.1:0` listeners land, so a
/// port there can be taken by an outgoing connection before the process meant to listen on it
/// binds it), picked at random so concurrent tests seldom try the same one. Free when picked,
/// a port may still be taken before it is bound: a caller that can tell (the collector's start)
/// picks again.
pub fn free_ports(n: u16) -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let ephemeral_low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.saturating_sub(n).max(10_001));
    for _ in 0..1000 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let base = low + (h.finish() % u64::from(high - low)) as u16;
        if (base..base + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return base;
        }
    }
    panic!("no {n} free ports in a row between {low} and {high}");
}

/// The token the test collectors accept for `node` (besides node-a and node-b).
pub fn token_for(node: &str) -> String {
    format!("token-for-{node}-0123456789")
}

/// The collector binary, serving on loopback.
pub struct CollectorProc {
    pub port: u16,
    pub http_port: u16,
    database_url: String,
    creds: PathBuf,
    extra_args: Vec<String>,
    extra_env: Vec<(String, String)>,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl CollectorProc {
    pub fn start(database_url: &str) -> CollectorProc {
        Self::start_with(database_url, &[], &[])
    }

    /// With credentials for `nodes` too, and extra `serve` arguments.
    pub fn start_with(database_url: &str, nodes: &[&str], extra_args: &[&str]) -> CollectorProc {
        Self::start_with_env(database_url, nodes, extra_args, &[])
    }

    /// [`CollectorProc::start_with`] with `env` in the collector's environment too.
    pub fn start_with_env(
        database_url: &str,
        nodes: &[&str],
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> CollectorProc {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        let mut text = format!("node-a {TOKEN_A}\nnode-b {TOKEN_B}\n");
        for n in nodes {
            text.push_str(&format!("{n} {}\n", token_for(n)));
        }
        write_secret(&creds, text);
        let (port, http_port) = free_port_pair();
        let mut c = CollectorProc {
            port,
            http_port,
            database_url: database_url.into(),
            creds,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            extra_env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            child: None,
            _dir: dir,
        };
        c.start_listening(true);
        c
    }

    fn spawn(&mut self) {
        let child = Command::new(bin("railguard-collector"))
            .args(["serve", "--grpc-listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--http-listen", &format!("127.0.0.1:{}", self.http_port)])
            // Assessed every second, unless the test sets its own period.
            .args(if self.extra_args.iter().any(|a| a == "--assess-every-secs") {
                &[][..]
            } else {
                &["--assess-every-secs", "1"][..]
            })
            .args(&self.extra_args)
            // Plaintext on loopback unless the test gives TLS files.
            .args(if self.extra_args.iter().any(|a| a == "--tls-cert") { &[][..] } else { &["--insecure"][..] })
            .arg("--credentials")
            .arg(&self.creds)
            .env("DATABASE_URL", &self.database_url)
            .env("RUST_LOG", "warn")
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Starts the process and waits for both its listeners. A process that exits first (a port
    /// taken between picking and binding) is started again: on new ports at the first start,
    /// on the same ones after a restart (the agents point there), a few times.
    fn start_listening(&mut self, new_ports: bool) {
        for attempt in 0.. {
            self.spawn();
            let child = self.child.as_mut().unwrap();
            let listening = wait::until(
                &format!("the collector listening on ports {} and {}", self.port, self.http_port),
                Duration::from_secs(60),
                || {
                    if let Ok(Some(status)) = child.try_wait() {
                        return Ok(Some(status));
                    }
                    let up = |p: u16| std::net::TcpStream::connect(("127.0.0.1", p)).is_ok();
                    if up(self.port) && up(self.http_port) { Ok(None) } else { Err("not yet listening") }
                },
            );
            match listening {
                None => return,
                Some(status) if attempt < 4 => {
                    eprintln!("the collector exited before listening ({status}); starting it again");
                    self.child = None;
                    if new_ports {
                        (self.port, self.http_port) = free_port_pair();
                    }
                }
                Some(status) => panic!("the collector exited before listening, {} times: {status}", attempt + 1),
            }
        }
    }

    /// GET on the HTTP API: (status code, body).
    pub fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        http_get(self.http_port, path, token)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.start_listening(false);
    }

    /// Assessment passes this collector has finished (`railguard_assessment_passes_total`, every
    /// kind), or 0 before its first.
    pub fn passes(&self) -> u64 {
        let (_, metrics) = self.get("/metrics", None);
        metrics
            .lines()
            .filter(|l| l.starts_with("railguard_assessment_passes_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Waits until a pass that began after this call has finished: whatever was stored before
    /// the call has been assessed (a pass in flight at the call may have read before it, so two
    /// more must finish).
    pub fn wait_for_a_later_pass(&self) {
        let from = self.passes();
        wait::until("an assessment pass begun after this point", Duration::from_secs(60), || {
            let now = self.passes();
            if now >= from + 2 { Ok(()) } else { Err(format!("{now} passes, waiting for {}", from + 2)) }
        });
    }

    /// The running process's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }
}

impl Drop for CollectorProc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn wait_for_port(port: u16) {
    wait::until(&format!("a listener on port {port}"), Duration::from_secs(60), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())
    });
}

/// The agent binary in one-shot mode: ships its spool and exits when drained.
/// A child process killed when this is dropped, so a failing test does not leave it running.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn agent_ship(collector_url: &str, spool_dir: &Path, token_file: &Path, batch_records: usize) -> Child {
    agent_ship_with(collector_url, spool_dir, token_file, batch_records, &[])
}

/// [`agent_ship`] with more arguments (TLS files, say).
pub fn agent_ship_with(
    collector_url: &str,
    spool_dir: &Path,
    token_file: &Path,
    batch_records: usize,
    extra: &[&std::ffi::OsStr],
) -> Child {
    agent_ship_command(collector_url, spool_dir, token_file, batch_records, extra).spawn().unwrap()
}

/// An agent shipping its spool whose warnings the test reads: each failed attempt to register
/// or send is a line of its log.
pub struct LoggedAgent {
    pub child: KillOnDrop,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl LoggedAgent {
    /// [`agent_ship_with`], logging warnings to a buffer of the test's.
    pub fn start(
        collector_url: &str,
        spool_dir: &Path,
        token_file: &Path,
        batch_records: usize,
        extra: &[&std::ffi::OsStr],
    ) -> LoggedAgent {
        let mut child = agent_ship_command(collector_url, spool_dir, token_file, batch_records, extra)
            .env("RUST_LOG", "warn")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (stderr, sink) = (child.stderr.take().unwrap(), log.clone());
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        LoggedAgent { child: KillOnDrop(child), log }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until it was refused `times` times (failed attempts it will retry), while still
    /// running and not drained; or until it exits, which must be a failure. Returns its log.
    pub fn wait_refused(&mut self, times: usize) -> String {
        wait::until(&format!("{times} refused attempts"), Duration::from_secs(60), || {
            if let Some(st) = self.child.0.try_wait().unwrap() {
                assert!(!st.success(), "the agent drained its spool: {}", self.log());
                return Ok(());
            }
            let failed = self.log().matches("failed; will retry").count();
            if failed >= times { Ok(()) } else { Err(format!("{failed} so far: {}", self.log())) }
        });
        self.log()
    }
}

/// The command [`agent_ship_with`] runs.
pub fn agent_ship_command(
    collector_url: &str,
    spool_dir: &Path,
    token_file: &Path,
    batch_records: usize,
    extra: &[&std::ffi::OsStr],
) -> Command {
    let mut cmd = Command::new(bin("railguard-agent"));
    cmd.args([
        "run",
        "--node-id",
        "node-a",
        "--collector",
        collector_url,
        "--exit-when-drained",
        "--backoff-max-ms",
        "500",
    ])
    .args(["--topology-interval", "0", "--probe-cycle-secs", "0", "--no-signals"]) // spool contents only
    .arg("--batch-records")
    .arg(batch_records.to_string())
    .arg("--token-file")
    .arg(token_file)
    .arg("--spool-dir")
    .arg(spool_dir)
    .args(if collector_url.starts_with("http://") { &["--insecure"][..] } else { &[][..] })
    .args(extra)
    .env("RUST_LOG", "error")
    .stdin(Stdio::null());
    cmd
}

/// Waits for `child` to exit (killing it if it does not within `within`, scaled).
pub fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let exited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait::until("the process to exit", within, || match child.try_wait().unwrap() {
            Some(st) => Ok(st),
            None => Err("running"),
        })
    }));
    exited.unwrap_or_else(|e| {
        let _ = child.kill();
        std::panic::resume_unwind(e)
    })
}

/// A synthetic probe result, labelled simulated (the test machine has no GPU or RDMA NIC).
pub fn probe(i: u64) -> ProbeResult {
    let bad = i % 7 == 3;
    ProbeResult {
        gpu: (i % 8) as u32,
        gpu_bdf: Some(Bdf::new(0, 0x18 + (i % 8) as u8, 0, 0)),
        nic: format!("mlx5_{}", i % 8),
        nic_bdf: Some(Bdf::new(0, 0x19 + (i % 8) as u8, 0, 0)),
        transport: Transport::Sim,
        bytes: 64 << 20,
        reported: Reported::Success,
        reported_detail: String::new(),
        verdict: if bad { ProbeVerdict::SilentCorruption } else { ProbeVerdict::Ok },
        diagnosis: if bad { Diagnosis::Untouched } else { Diagnosis::None },
        first_bad_offset: bad.then_some(0),
        bad_chunks: if bad { 64 } else { 0 },
        chunks: 64,
        duration_ns: 1_000_000 + i,
        selection: PairSelection::Sweep,
        simulated: true,
        bit_flips: 0,
        receiver_detail: String::new(),
        memory: railguard_schema::Memory::Host,
        path: railguard_schema::DataPath::Simulated,
        injected: railguard_schema::Injected::None,
        lanes: Vec::new(),
    }
}

pub fn signal(i: u64) -> SignalEvent {
    SignalEvent {
        source: SignalSource::Kmsg,
        kind: SignalKind::GpuXid,
        bdf: Some(Bdf::new(0, 0x91, 0, 0)),
        gpu: Some(7),
        nic: String::new(),
        summary: format!(
            "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus. #{i}"
        ),
        attrs: [("xid".to_owned(), "79".to_owned())].into(),
    }
}

/// `n` records: mostly probes, every tenth a signal.
pub fn records(n: u64) -> Vec<wire::Record> {
    (0..n)
        .map(|i| {
            let body = if i % 10 == 9 { RecordBody::Signal(signal(i)) } else { RecordBody::Probe(probe(i)) };
            Record { id: RecordId::random(), observed_at: Utc::now(), body }.into()
        })
        .collect()
}

/// A spool holding `n` records, and the token file for node-a, in `dir`.
pub fn filled_spool(dir: &Path, n: u64) -> (PathBuf, PathBuf) {
    spool_of(dir, &records(n))
}

/// A spool holding `recs`, and the token file for node-a, in `dir`.
pub fn spool_of(dir: &Path, recs: &[wire::Record]) -> (PathBuf, PathBuf) {
    use railguard_agent::spool::{Spool, SpoolConfig};
    let spool_dir = dir.join("spool");
    let mut spool = Spool::open(&spool_dir, SpoolConfig::default()).unwrap();
    for chunk in recs.chunks(10_000) {
        assert_eq!(spool.append(chunk).unwrap().dropped, 0);
    }
    let token = dir.join("token");
    write_secret(&token, TOKEN_A);
    (spool_dir, token)
}

/// A gRPC request carrying `Bearer {token}`, as an agent sends it.
pub fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

/// A minimal HTTP/1.1 GET over loopback (no client library needed for a read-only API).
pub fn http_get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    http_request(port, "GET", path, &auth, "")
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n.min(rest.len())]);
        body = rest.get(n + 2..).unwrap_or("");
    }
    out
}

/// A minimal HTTP/1.1 request with a JSON body (WebDriver speaks this): (status, body).
pub fn http_json(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    http_request(port, method, path, "Content-Type: application/json\r\n", body)
}

/// One request on a fresh connection; `headers` are complete `Name: value\r\n` lines.
fn http_request(port: u16, method: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read the head, then exactly Content-Length bytes: chromedriver keeps the connection open.
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let (head, body_start) = loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed before the response head");
        raw.extend_from_slice(&buf[..n]);
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break (String::from_utf8_lossy(&raw[..i]).into_owned(), i + 4);
        }
    };
    let code: u16 = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let len: Option<usize> = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)));
    let mut body = raw[body_start..].to_vec();
    match len {
        Some(len) => {
            while body.len() < len {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&buf[..n]);
            }
        }
        None => {
            s.read_to_end(&mut body).unwrap();
        }
    }
    let rest = String::from_utf8_lossy(&body).into_owned();
    let rest = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(&rest) } else { rest };
    (code, rest)
}

/// Test certificates made with the openssl CLI: a CA, and leaves it signs.
pub mod certs {
    use std::path::Path;
    use std::process::Command;

    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl").current_dir(dir).args(args).output().unwrap();
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// A CA named `name` in `dir`: `{name}.pem`, `{name}.key`.
    pub fn ca(dir: &Path, name: &str) {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
                "-subj",
                &format!("/CN={name}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
    }

    /// A certificate `{name}.pem`/`{name}.key` signed by CA `ca`, with extensions `ext`.
    pub fn leaf(dir: &Path, ca: &str, name: &str, cn: &str, ext: &str) {
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={cn}"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &format!("{name}.pem"),
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
    }

    /// A CA `ca` with a server certificate `server` for 127.0.0.1/localhost and a client
    /// certificate `client` (CN node-a), in `dir`.
    pub fn server_and_client(dir: &Path) {
        ca(dir, "ca");
        leaf(
            dir,
            "ca",
            "server",
            "localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        );
        leaf(dir, "ca", "client", "node-a", "subjectAltName=DNS:node-a\nextendedKeyUsage=clientAuth\n");
    }
}

/// `${XDG_CACHE_HOME:-$HOME/.cache}/railguard/<name>`: where scripts/setup.sh puts the virtual
/// environment `name` (schemathesis, helm, …); a test needing it fails naming setup.sh.
pub fn setup_env(name: &str) -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
    let dir = cache.join("railguard").join(name);
    assert!(dir.exists(), "{} is missing: run scripts/setup.sh", dir.display());
    dir
}

/// The Python of the virtualenv scripts/setup.sh installs NIXL (nixl-cu12) and numpy into, or
/// RAILGUARD_NIXL_PYTHON (the agent's own lookup).
pub fn nixl_python() -> PathBuf {
    railguard_agent::probe::transport::nixl::locate::setup_python(&|k| std::env::var(k).ok())
        .expect("no NIXL virtualenv: scripts/setup.sh installs nixl-cu12 and numpy into ~/.cache/railguard/nixl")
}

/// Runs `program` holding the fixture's simulated device file of GPU `held` open (descriptor 9,
/// as a CUDA process holds /dev/nvidiaN), or nothing.
pub fn holding(node: &std::path::Path, held: Option<u32>, program: &std::path::Path) -> Command {
    match held {
        None => Command::new(program),
        Some(g) => {
            let mut c = Command::new("sh");
            c.args(["-c", r#"exec 9<"$RAILGUARD_TEST_DEVICE" && exec "$0" "$@""#]).arg(program);
            c.env("RAILGUARD_TEST_DEVICE", node.join(format!("dev/nvidia{g}")));
            c
        }
    }
}

/// The Python of the vLLM connector's environment (vLLM 0.33.0, torch, NIXL): installed on first
/// use by scripts/setup-vllm.sh (cached, ~10 GB; concurrent callers wait for one install).
pub fn vllm_python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/setup-vllm.sh");
            let out = Command::new("bash").arg(script).stderr(Stdio::inherit()).output().unwrap();
            assert!(out.status.success(), "scripts/setup-vllm.sh failed");
            let path = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
            PathBuf::from(path)
        })
        .clone()
}

/// integrations/nixl (railguard's NIXL library).
pub fn nixl_integration() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../integrations/nixl")
}

/// The seed's failure on the simulated fabric, as its physical model (agent/src/probe/sim_model.rs):
/// in a guest without a vIOMMU, a NIC's DMA read of GPU memory whose route turns inside a switch is
/// rejected while the transport reports success. Decided from each node's tree, never from the
/// classifier's path classes.
pub const SEED_MODEL: &str = r#"{"model": "passthrough_p2p"}"#;

/// The agent binary as node-a on the seed fixture (written under `dir`: node/, token, spool/),
/// sending to `collector` in plaintext on loopback, with `extra` flags.
pub fn seed_agent(collector: &CollectorProc, dir: &Path, extra: &[&std::ffi::OsStr]) -> KillOnDrop {
    fixture_agent(&railguard_agent::topology::fixture::seed_kvm_guest(), collector, dir, extra)
}

/// The agent binary as node-a on `spec` (written under `dir`: node/, token, spool/), sending to
/// `collector` in plaintext on loopback, with `extra` flags.
pub fn fixture_agent(
    spec: &railguard_agent::topology::fixture::FixtureSpec,
    collector: &CollectorProc,
    dir: &Path,
    extra: &[&std::ffi::OsStr],
) -> KillOnDrop {
    spec.write(&dir.join("node")).unwrap();
    let token = dir.join("token");
    write_secret(&token, TOKEN_A);
    Command::new(bin("railguard-agent"))
        .args(["run", "--insecure", "--node-id", "node-a", "--collector", &collector.url(), "--token-file"])
        .arg(&token)
        .arg("--spool-dir")
        .arg(dir.join("spool"))
        .arg("--sysfs-root")
        .arg(dir.join("node/sys"))
        .arg("--simulated-gpu-devices")
        .arg(dir.join("node/dev"))
        .args(extra)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .spawn()
        .map(KillOnDrop)
        .unwrap()
}

/// The number after `field` (with its colon: `VmHWM:`, `PPid:`, `Pss:`) in a process's
/// `/proc/PID/<file>` (`status`, `smaps_rollup`): kB for sizes.
pub fn proc_field(pid: u32, file: &str, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    s.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// User + system CPU seconds of a process so far (/proc/PID/stat, clock ticks of 1/100 s).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command: utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}
