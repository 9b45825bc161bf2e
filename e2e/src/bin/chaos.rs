//! railguard's chaos suite: agents (the real binary, probing the simulated seed node) ship
//! continuously to a real collector and Postgres while the suite breaks things, one fault at a
//! time. For each fault it prints what the agents produced, what the collector stored, and what
//! was counted as dropped or set aside, and exits non-zero on any unexplained difference (or a
//! fault that did not happen).
//!
//! Faults: the collector SIGKILLed 10 times; Postgres restarted; the agent→collector link cut
//! for 60 s (a network namespace and veth pair the suite creates, the agent inside, a forwarder
//! on the host side); the spool's filesystem filled (a small tmpfs); an agent's clock skewed by
//! +5 h (libfaketime); on a highly available Postgres (`scripts/pg-ha.sh`: Patroni, synchronous
//! standbys, HAProxy), the primary's postmaster SIGKILLed with its data directory deleted, then a
//! planned Patroni switchover; 32 readers of every API route in a closed loop while an agent
//! ships (16 in the short form: ingest must not notice them). Network namespaces and tmpfs need root: without it those faults are
//! reported as not run, and the suite fails.
//!
//! Run: `cargo run -p railguard-e2e --bin chaos` (about 3 minutes), or `-- --short` (about a
//! minute: 3 kills, a 5 s cut; what CI runs, e2e/tests/chaos.rs). Build the workspace first.
#![allow(clippy::unwrap_used)] // a harness: a broken setup should stop it loudly

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use railguard_e2e::{CollectorProc, TestPg, token_for};

/// A sibling binary of this one (target/debug/chaos → target/debug/railguard-agent).
fn sibling(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    [dir.join(name), dir.parent().unwrap().join(name)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} is missing next to {}: `cargo build --workspace` first", exe.display()))
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// One node's agent, producing probes of the simulated seed node and shipping them.
struct Agent {
    node: String,
    child: Option<Child>,
    spool: PathBuf,
    token: PathBuf,
    log: PathBuf,
}

struct Ctx {
    dir: tempfile::TempDir,
    sys: PathBuf,
    agent_bin: PathBuf,
}

impl Ctx {
    fn agent(
        &self,
        node: &str,
        collector: &str,
        netns: Option<&str>,
        env: &[(&str, String)],
        spool: Option<PathBuf>,
        extra: &[String],
    ) -> Agent {
        let token = self.dir.path().join(format!("{node}.token"));
        railguard_e2e::write_secret(&token, token_for(node));
        std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let spool = spool.unwrap_or_else(|| self.dir.path().join(format!("{node}.spool")));
        let log = self.dir.path().join(format!("{node}.log"));
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.agent_bin);
                c
            }
            None => Command::new(&self.agent_bin),
        };
        cmd.args(["run", "--node-id", node, "--collector", collector, "--insecure", "--token-file"])
            .arg(&token)
            .arg("--spool-dir")
            .arg(&spool)
            .arg("--sysfs-root")
            .arg(&self.sys)
            .args(["--fabric", "sim", "--probe-cycle-secs", "1", "--probe-bytes", "4K", "--no-signals"])
            // Every probe a record (raw mode): the suite counts records through each fault, so
            // the agents must keep producing them; compaction, which sends a node's ok probes as
            // one record per window, has its own tests (agent compact.rs, e2e compaction.rs).
            .args(["--probe-summary-secs", "0"])
            .args(["--backoff-max-ms", "300", "--batch-records", "200"])
            .args(if extra.iter().any(|a| a == "--spool-max-bytes") {
                &[][..]
            } else {
                &["--spool-max-bytes", "67108864"][..]
            })
            .args(extra)
            .env("RUST_LOG", "warn,railguard_agent::service=info")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        Agent { node: node.to_owned(), child: Some(cmd.spawn().unwrap()), spool, token, log }
    }
}

/// Strips terminal colour codes from a log line.
fn plain(s: &str) -> String {
    let mut out = String::new();
    let mut esc = false;
    for c in s.chars() {
        match (esc, c) {
            (false, '\u{1b}') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}

fn field(line: &str, name: &str) -> Option<u64> {
    line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{name}="))?.parse().ok())
}

impl Agent {
    /// Stops it (SIGTERM) and returns (appended, dropped) from its own account of the run.
    fn stop(&mut self) -> Result<(u64, u64), String> {
        let Some(mut child) = self.child.take() else { return Err("not running".into()) };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err(format!("{} did not stop within 60 s of SIGTERM", self.node));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let line = log.lines().map(plain).find(|l| l.contains("spool totals for this run"));
        match line {
            Some(l) => Ok((field(&l, "appended").unwrap_or(0), field(&l, "dropped").unwrap_or(0))),
            None => Err(format!(
                "{} said no spool totals; its log:\n{}",
                self.node,
                log.lines().rev().take(10).collect::<Vec<_>>().join("\n")
            )),
        }
    }

    /// Ships what is left in the spool over loopback and exits when it is empty.
    fn drain(&self, agent_bin: &Path, collector: &str) -> Result<(), String> {
        let mut child = Command::new(agent_bin)
            .args(["run", "--node-id", &self.node, "--collector", collector, "--insecure", "--exit-when-drained"])
            .args(["--topology-interval", "0", "--probe-cycle-secs", "0", "--no-signals", "--backoff-max-ms", "300"])
            .arg("--token-file")
            .arg(&self.token)
            .arg("--spool-dir")
            .arg(&self.spool)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return if st.success() { Ok(()) } else { Err(format!("draining {}: {st}", self.node)) };
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err(format!("draining {} took over 180 s", self.node));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Records the collector refused, set aside by the agent (one JSON line each).
    fn rejected(&self) -> u64 {
        std::fs::read_to_string(self.spool.join("rejected.jsonl")).map_or(0, |s| s.lines().count() as u64)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One fault's accounting.
struct Outcome {
    fault: String,
    produced: u64,
    stored: u64,
    dropped: u64,
    rejected: u64,
    duplicates: u64,
    note: String,
    error: Option<String>,
}

impl Outcome {
    /// Nothing counted yet.
    fn new(fault: &str, note: String) -> Outcome {
        Outcome {
            fault: fault.to_owned(),
            produced: 0,
            stored: 0,
            dropped: 0,
            rejected: 0,
            duplicates: 0,
            note,
            error: None,
        }
    }

    fn explained(&self) -> bool {
        self.error.is_none() && self.duplicates == 0 && self.produced == self.stored + self.dropped + self.rejected
    }
}

async fn stored_of(pool: &sqlx::PgPool, node: &str) -> (u64, u64, u64) {
    let (n, distinct): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT record_id) FROM (
            SELECT record_id FROM probe_results WHERE node_id = $1 UNION ALL
            SELECT record_id FROM probe_summary_sets WHERE node_id = $1 UNION ALL
            SELECT record_id FROM signal_events WHERE node_id = $1 AND kind <> 'agent_spool_drops' UNION ALL
            SELECT record_id FROM topology_snapshots WHERE node_id = $1 UNION ALL
            SELECT record_id FROM inline_reports WHERE node_id = $1) r",
    )
    .bind(node)
    .fetch_one(pool)
    .await
    .unwrap();
    let dropped: Option<i64> = sqlx::query_scalar("SELECT spool_dropped_total FROM nodes WHERE node_id = $1")
        .bind(node)
        .fetch_optional(pool)
        .await
        .unwrap();
    (n as u64, (n - distinct) as u64, dropped.unwrap_or(0) as u64)
}

/// Stops the agents, drains their spools, and accounts for every record.
async fn settle(
    ctx: &Ctx,
    pool: &sqlx::PgPool,
    collector: &CollectorProc,
    fault: &str,
    agents: &mut [Agent],
    note: String,
) -> Outcome {
    let mut out = Outcome::new(fault, note);
    for a in agents.iter_mut() {
        match a.stop() {
            Ok((appended, dropped)) => out.produced += appended + dropped,
            Err(e) => out.error = Some(e),
        }
        if let Err(e) = a.drain(&ctx.agent_bin, &collector.url()) {
            out.error = Some(e);
        }
        let (stored, dups, dropped) = stored_of(pool, &a.node).await;
        out.stored += stored;
        out.duplicates += dups;
        out.dropped += dropped;
        out.rejected += a.rejected();
    }
    out
}

fn pause(d: Duration) {
    std::thread::sleep(d);
}

/// A network namespace with a veth pair to this one, removed on drop.
struct Netns {
    name: String,
    host_if: String,
}

impl Netns {
    fn create(tag: u32) -> Result<Netns, String> {
        let name = format!("rgchaos{tag}");
        let (a, b) = (format!("rgc{tag}a"), format!("rgc{tag}b"));
        let ns = Netns { name: name.clone(), host_if: a.clone() };
        sh(&["ip", "netns", "add", &name])?;
        sh(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b])?;
        sh(&["ip", "link", "set", &b, "netns", &name])?;
        sh(&["ip", "addr", "add", "10.213.7.1/30", "dev", &a])?;
        sh(&["ip", "link", "set", &a, "up"])?;
        sh(&["ip", "netns", "exec", &name, "ip", "addr", "add", "10.213.7.2/30", "dev", &b])?;
        sh(&["ip", "netns", "exec", &name, "ip", "link", "set", &b, "up"])?;
        sh(&["ip", "netns", "exec", &name, "ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    fn link(&self, up: bool) -> Result<(), String> {
        sh(&["ip", "link", "set", &self.host_if, if up { "up" } else { "down" }])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh(&["ip", "link", "del", &self.host_if]);
        let _ = sh(&["ip", "netns", "del", &self.name]);
    }
}

/// Forwards 10.213.7.1:`port` (the host end of the veth) to the collector on loopback.
async fn forward(listen: std::net::SocketAddr, to: u16) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let l = tokio::net::TcpListener::bind(listen).await?;
    Ok(tokio::spawn(async move {
        while let Ok((mut inbound, _)) = l.accept().await {
            tokio::spawn(async move {
                if let Ok(mut out) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    }))
}

/// Forwards each connection to `listen` to the first of `to` (collectors on loopback) that
/// accepts it, starting one further along each time: one address in front of several
/// collectors, as a load balancer puts them.
async fn front(listen: std::net::SocketAddr, to: Vec<u16>) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let l = tokio::net::TcpListener::bind(listen).await?;
    Ok(tokio::spawn(async move {
        let mut next = 0usize;
        while let Ok((mut inbound, _)) = l.accept().await {
            let order: Vec<u16> = (0..to.len()).map(|i| to[(next + i) % to.len()]).collect();
            next = next.wrapping_add(1);
            tokio::spawn(async move {
                for port in order {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        return;
                    }
                }
            });
        }
    }))
}

/// A collector's gauge `name` from its /metrics (None: not answered or absent).
fn gauge(c: &CollectorProc, name: &str) -> Option<usize> {
    let (code, m) = c.get("/metrics", None);
    if code != 200 {
        return None;
    }
    m.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).and_then(|v| v.parse().ok())
}

/// Whether `cs` hold every part of the assessment between them, each seeing `members` members.
fn split_among(cs: &[&CollectorProc], members: usize) -> bool {
    let held: Option<Vec<usize>> = cs.iter().map(|c| gauge(c, "railguard_assessment_parts_held")).collect();
    held.is_some_and(|h| h.iter().sum::<usize>() == railguard_collector::assess::PARTS as usize)
        && cs.iter().all(|c| gauge(c, "railguard_assessment_members") == Some(members))
}

/// Polls `done` every 200 ms for at most `limit`: how long it took, or None.
fn within(limit: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if done() {
            return Some(t.elapsed());
        }
        pause(Duration::from_millis(200));
    }
    None
}

/// "one of 3 collectors killed": two more collectors join `first` on its Postgres and the three
/// split the assessment; two agents ship through one address in front of all three; the
/// collector holding the part of the first agent's node is SIGKILLed. Every record is
/// accounted for (the agents reconnect through the front to the two left, and drain to them),
/// the two left hold every part within 60 s, and every part, the dead one's among them, is
/// passed over by them within 60 s.
async fn one_of_three(ctx: &Ctx, pg: &TestPg, first: &mut CollectorProc, nodes: [&str; 2], short: bool) -> Outcome {
    const FAULT: &str = "one of 3 collectors killed";
    let parts = railguard_collector::assess::PARTS as usize;
    let mut others =
        [CollectorProc::start_with(&pg.url(), &nodes, &[]), CollectorProc::start_with(&pg.url(), &nodes, &[])];
    let split = within(Duration::from_secs(60), || split_among(&[&*first, &others[0], &others[1]], 3));
    if split.is_none() {
        return Outcome {
            error: Some("the three collectors never split the parts".into()),
            ..Outcome::new(FAULT, String::new())
        };
    }
    let settled_at = chrono::Utc::now();
    let port = railguard_e2e::free_port();
    let fwd = match front(([127, 0, 0, 1], port).into(), vec![first.port, others[0].port, others[1].port]).await {
        Ok(f) => f,
        Err(e) => return not_run(FAULT, format!("binding the front address: {e}")),
    };
    let url = format!("http://127.0.0.1:{port}");
    let mut agents: Vec<Agent> = nodes.iter().map(|n| ctx.agent(n, &url, None, &[], None, &[])).collect();
    // The victim: whoever passed over the first node's part since the three split.
    let mut holder = None;
    within(Duration::from_secs(30), || {
        holder = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(
                sqlx::query_scalar::<_, String>(
                    "SELECT holder FROM assessment_parts
                     WHERE part = (SELECT assess_part FROM nodes WHERE node_id = $1) AND finished_at > $2",
                )
                .bind(nodes[0])
                .bind(settled_at)
                .fetch_optional(&pg.pool),
            )
        })
        .ok()
        .flatten();
        holder.is_some()
    });
    let pid_of = |c: &CollectorProc| c.pid().map(|p| format!(":{p}"));
    let Some(holder) = holder else {
        let mut o = settle(ctx, &pg.pool, first, FAULT, &mut agents, String::new()).await;
        o.error = Some(format!("{}'s part was never passed over after the split", nodes[0]));
        return o;
    };
    let victim = if pid_of(first).is_some_and(|p| holder.ends_with(&p)) {
        None
    } else {
        others.iter().position(|c| pid_of(c).is_some_and(|p| holder.ends_with(&p)))
    };
    let victim_parts = match victim {
        None => gauge(first, "railguard_assessment_parts_held"),
        Some(i) => gauge(&others[i], "railguard_assessment_parts_held"),
    };
    pause(Duration::from_secs(if short { 2 } else { 10 }));
    let killed_at = chrono::Utc::now();
    match victim {
        None => first.kill(),
        Some(i) => others[i].kill(),
    }
    let left: Vec<&CollectorProc> = match victim {
        None => others.iter().collect(),
        Some(i) => {
            std::iter::once(&*first).chain(others.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, c)| c)).collect()
        }
    };
    let took_over = within(Duration::from_secs(60), || split_among(&left, 2));
    let passed = within(Duration::from_secs(60), || {
        let stale: Result<i64, _> = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(
                sqlx::query_scalar("SELECT $2 - count(*) FROM assessment_parts WHERE finished_at > $1")
                    .bind(killed_at)
                    .bind(parts as i64)
                    .fetch_one(&pg.pool),
            )
        });
        stale.is_ok_and(|n| n == 0)
    });
    pause(Duration::from_secs(if short { 3 } else { 20 }));
    let secs = |d: Option<Duration>| d.map_or("never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
    let note = format!(
        "killed the {} collector, holding {} of {parts} parts ({}'s among them); the two left held all {parts} after {}, passed over every part after {}",
        if victim.is_none() { "first" } else { "added" },
        victim_parts.map_or("?".to_owned(), |n| n.to_string()),
        nodes[0],
        secs(took_over),
        secs(took_over.zip(passed).map(|(a, b)| a + b)),
    );
    let mut o = settle(ctx, &pg.pool, left[0], FAULT, &mut agents, note).await;
    if o.error.is_none() {
        o.error = match (took_over, passed) {
            (None, _) => Some("the two left never held every part".into()),
            (_, None) => Some("a part was not passed over within 60 s of the kill".into()),
            _ => None,
        };
    }
    fwd.abort();
    if victim.is_none() {
        first.restart();
    }
    o
}

/// A small tmpfs, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        sh(&["mount", "-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs", at.to_str().unwrap()])?;
        Ok(Tmpfs(at.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = sh(&["umount", "-l", self.0.to_str().unwrap()]);
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> std::process::ExitCode {
    let short = std::env::args().any(|a| a == "--short");
    let kills = if short { 3 } else { 10 };
    let cut = Duration::from_secs(if short { 5 } else { 60 });
    let started = Instant::now();
    let root = nix::unistd::geteuid().is_root();

    let dir = tempfile::Builder::new().prefix("railguard-chaos-").tempdir().unwrap();
    railguard_agent::topology::fixture::seed_kvm_guest().write(&dir.path().join("node")).unwrap();
    let ctx = Ctx { sys: dir.path().join("node/sys"), agent_bin: sibling("railguard-agent"), dir };
    // The collector binary sits beside the agent's; the e2e helpers find it from the test path.
    let pg = TestPg::start().await;
    let nodes = [
        "chaos-kill-1",
        "chaos-kill-2",
        "chaos-pg",
        "chaos-link",
        "chaos-spool",
        "chaos-clock",
        "chaos-inline",
        "chaos-readers",
        "chaos-share-1",
        "chaos-share-2",
    ];
    let mut collector = CollectorProc::start_with(&pg.url(), &nodes, &[]);
    let url = collector.url();
    let mut results: Vec<Outcome> = Vec::new();

    // 1. The collector SIGKILLed while two agents ship.
    {
        let mut agents =
            vec![ctx.agent(nodes[0], &url, None, &[], None, &[]), ctx.agent(nodes[1], &url, None, &[], None, &[])];
        pause(Duration::from_secs(2));
        for i in 0..kills {
            collector.restart(); // SIGKILL, then a new process on the same ports
            pause(Duration::from_millis(800 + 300 * (i % 4)));
        }
        let note = format!("{kills} SIGKILLs");
        results.push(settle(&ctx, &pg.pool, &collector, "collector SIGKILLed", &mut agents, note).await);
    }

    // 2. Postgres restarted under the collector.
    {
        let mut agents = vec![ctx.agent(nodes[2], &url, None, &[], None, &[])];
        pause(Duration::from_secs(3));
        let t = Instant::now();
        let r = tokio::task::block_in_place(|| pg.cluster.restart());
        let note = format!("restart took {:.1} s", t.elapsed().as_secs_f64());
        pause(Duration::from_secs(3));
        let mut o = settle(&ctx, &pg.pool, &collector, "Postgres restarted", &mut agents, note).await;
        if let Err(e) = r {
            o.error = Some(format!("restarting Postgres: {e}"));
        }
        results.push(o);
    }

    // 3. The agent→collector link cut (a veth pair into a namespace of the suite's own).
    if root {
        let tag = std::process::id() % 10_000;
        match Netns::create(tag) {
            Ok(ns) => {
                let port = railguard_e2e::free_port();
                let fwd = forward(([10, 213, 7, 1], port).into(), collector.port).await.unwrap();
                let mut agents =
                    vec![ctx.agent(nodes[3], &format!("http://10.213.7.1:{port}"), Some(&ns.name), &[], None, &[])];
                pause(Duration::from_secs(3));
                let before = stored_of(&pg.pool, nodes[3]).await.0;
                let cut_ok = ns.link(false);
                pause(cut);
                let during = stored_of(&pg.pool, nodes[3]).await.0;
                let up = ns.link(true);
                pause(Duration::from_secs(if short { 8 } else { 15 }));
                let note = format!("cut {} s; stored {before} before, {during} when the link came back", cut.as_secs());
                let mut o = settle(&ctx, &pg.pool, &collector, "link cut", &mut agents, note).await;
                if let Err(e) = cut_ok.and(up) {
                    o.error = Some(e);
                }
                fwd.abort();
                results.push(o);
            }
            Err(e) => results.push(not_run("link cut", e)),
        }
    } else {
        results.push(not_run("link cut", "needs root (network namespaces)".into()));
    }

    // 4. The spool's filesystem filled: a 256 KiB tmpfs while the collector is down.
    if root {
        match Tmpfs::mount(&ctx.dir.path().join("spool-tmpfs"), "256k") {
            Ok(fs) => {
                // Every probe in full: compaction would hold the ok probes in memory, and this
                // fault needs a spool that fills.
                let raw = [("RAILGUARD_PROBE_SUMMARY", "0".to_owned())];
                let mut agents = vec![ctx.agent(nodes[4], &url, None, &raw, Some(fs.0.join("spool")), &[])];
                pause(Duration::from_secs(2));
                collector.kill();
                let t = Instant::now();
                // Until the agent says the disk is full (dropped records are counted in its log).
                while t.elapsed() < Duration::from_secs(60)
                    && !std::fs::read_to_string(&agents[0].log).unwrap_or_default().contains("records not spooled")
                {
                    pause(Duration::from_millis(500));
                }
                pause(Duration::from_secs(3));
                collector.restart();
                pause(Duration::from_secs(5));
                let note =
                    format!("collector down {:.0} s over a 256 KiB spool filesystem", t.elapsed().as_secs_f64() - 5.0);
                let mut o = settle(&ctx, &pg.pool, &collector, "spool filesystem full", &mut agents, note).await;
                if o.dropped == 0 && o.error.is_none() {
                    o.error = Some("the spool never filled: the fault did not happen".into());
                }
                results.push(o);
                drop(fs);
            }
            Err(e) => results.push(not_run("spool filesystem full", e)),
        }
    } else {
        results.push(not_run("spool filesystem full", "needs root (mounting a tmpfs)".into()));
    }

    // 5. An agent's clock 5 hours ahead (libfaketime; the monotonic clock left alone).
    let faketime =
        ["/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"]
            .into_iter()
            .find(|p| Path::new(p).exists());
    match faketime {
        Some(lib) => {
            let env = [
                ("LD_PRELOAD", lib.to_owned()),
                ("FAKETIME", "+5h".to_owned()),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
            ];
            let mut agents = vec![ctx.agent(nodes[5], &url, None, &env, None, &[])];
            pause(Duration::from_secs(5));
            let mut o = settle(&ctx, &pg.pool, &collector, "agent clock +5 h", &mut agents, String::new()).await;
            // The collector refuses records dated more than its bound ahead of its own clock:
            // the agent sets each aside (rejected.jsonl, kept), nothing of them is stored, and the
            // collector's gauge says how far ahead the agent's clock runs.
            let (_, metrics) = collector.get("/metrics", None);
            let ahead: Option<f64> = metrics
                .lines()
                .find(|l| l.starts_with(&format!("railguard_agent_clock_ahead_seconds{{node=\"{}\"}}", nodes[5])))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok());
            o.note = format!(
                "refused at ingest (more than {} s ahead), set aside by the agent; collector's railguard_agent_clock_ahead_seconds = {}",
                railguard_schema::limits::MAX_CLOCK_AHEAD_SECS,
                ahead.map_or("absent".to_owned(), |a| format!("{:.2} h", a / 3600.0))
            );
            if (o.stored > 0 || o.rejected == 0) && o.error.is_none() {
                o.error = Some(format!(
                    "records dated 5 h ahead were stored ({} stored, {} set aside)",
                    o.stored, o.rejected
                ));
            }
            if ahead.is_none_or(|a| (a / 3600.0 - 5.0).abs() > 0.1) && o.error.is_none() {
                o.error = Some(format!("the collector did not see the agent's clock 5 h ahead ({ahead:?})"));
            }
            results.push(o);
        }
        None => results.push(not_run("agent clock +5 h", "libfaketime is not installed (scripts/setup.sh)".into())),
    }

    // 6. A local process floods the in-line endpoint while the collector is down: in-line reports
    //    fill only their half of a 1 MiB spool, so the agent's own probes are never dropped.
    {
        let sock = ctx.dir.path().join("inline.sock");
        let dev = ctx.dir.path().join("node/dev");
        // The flood's senders are pods of their own: each runs as a uid of its own (a sender is
        // its uid and control group), so the directories on the way and the socket let them in.
        std::fs::set_permissions(ctx.dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("the chaos directory's mode");
        let extra: Vec<String> = [
            "--inline-socket",
            sock.to_str().unwrap(),
            "--inline-socket-mode",
            "666",
            "--simulated-gpu-devices",
            dev.to_str().unwrap(),
            "--spool-max-bytes",
            "1048576",
        ]
        .map(str::to_owned)
        .to_vec();
        let mut agents = vec![ctx.agent(nodes[6], &url, None, &[], None, &extra)];
        let t = Instant::now();
        while !sock.exists() && t.elapsed() < Duration::from_secs(30) {
            pause(Duration::from_millis(100));
        }
        pause(Duration::from_secs(2));
        collector.kill();
        let flood_from = chrono::Utc::now();
        let senders = if short { 6 } else { 16 };
        let flood = inline_flood(&sock, &dev.join("nvidia3"), senders, 300);
        pause(Duration::from_secs(if short { 5 } else { 15 }));
        let flood_to = chrono::Utc::now();
        collector.restart();
        pause(Duration::from_secs(3));
        let mut o = settle(&ctx, &pg.pool, &collector, "in-line flood", &mut agents, String::new()).await;
        let probes_in_flood: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM probe_results WHERE node_id = $1 AND observed_at BETWEEN $2 AND $3",
        )
        .bind(nodes[6])
        .bind(flood_from)
        .bind(flood_to)
        .fetch_one(&pg.pool)
        .await
        .unwrap();
        o.note = format!(
            "{senders} senders: {} reports spooled, {} refused at the spool's in-line ceiling, {} over their rate; {probes_in_flood} probes of the flood's time stored",
            flood.accepted, flood.no_room, flood.rate_limited
        );
        match flood.error {
            Some(e) => o.error = Some(e),
            None if flood.no_room == 0 => {
                o.error = Some("the flood never reached the in-line ceiling: the fault did not happen".into());
            }
            None if o.dropped != flood.no_room => {
                o.error = Some(format!(
                    "{} records dropped but {} in-line reports refused at the ceiling: the flood pushed other records out",
                    o.dropped, flood.no_room
                ));
            }
            None if probes_in_flood == 0 => o.error = Some("no probe of the flood's time was stored".into()),
            None => {}
        }
        results.push(o);
    }

    // 7. Readers of every API route in a closed loop while an agent ships: the reads have a pool
    //    and a cap of their own, so ingest goes on as if they were not there (a read over the cap
    //    is answered 503, never left hanging).
    {
        let mut agents = vec![ctx.agent(nodes[7], &url, None, &[], None, &[])];
        pause(Duration::from_secs(3));
        let (readers, secs) = if short { (16, 10) } else { (32, 30) };
        let from = chrono::Utc::now();
        let tallies = std::sync::Arc::new(railguard_e2e::readers::ReadTallies::default());
        let routes = std::sync::Arc::new(railguard_e2e::readers::routes(&nodes.map(str::to_owned)));
        let end = Instant::now() + Duration::from_secs(secs);
        let tasks = railguard_e2e::readers::spawn(readers, collector.http_port, &routes, end, &tallies);
        for t in tasks {
            let _ = t.await;
        }
        let gap = longest_pause(&pg.pool, &nodes[7..8], from).await;
        let railguard_e2e::readers::ReadTotals { reads: all, ok, busy, failed, unanswered } = tallies.totals();
        let mut o = settle(&ctx, &pg.pool, &collector, "API readers flood", &mut agents, String::new()).await;
        o.note = format!(
            "{readers} readers for {secs} s: {all} reads, {ok} answered 200, {busy} 503 (the read cap), {} other, {unanswered} unanswered; ingest's longest pause {:.1} s",
            all - ok - busy - unanswered,
            gap.as_secs_f64()
        );
        if o.error.is_none() {
            o.error = if ok == 0 {
                Some("no read was answered: the fault did not happen".into())
            } else if unanswered > 0 || failed > 0 {
                Some(format!("{unanswered} reads unanswered, {failed} answered a server error other than 503"))
            } else if o.dropped > 0 || o.rejected > 0 {
                Some(format!("{} records dropped and {} refused while readers read", o.dropped, o.rejected))
            } else if gap >= Duration::from_secs(30) {
                Some(format!("ingest paused {:.1} s while readers read", gap.as_secs_f64()))
            } else {
                None
            };
        }
        results.push(o);
    }

    // 8. One of three collectors SIGKILLed while agents ship through one address in front of
    //    all three: the two left take its parts of the assessment.
    results.push(one_of_three(&ctx, &pg, &mut collector, [nodes[8], nodes[9]], short).await);

    // 9–10. The collector on a highly available Postgres: the primary's machine lost, then a
    //       planned switchover.
    results.extend(ha_faults(&ctx, short).await);

    println!("railguard chaos suite{} ({:.0} s)", if short { " (short)" } else { "" }, started.elapsed().as_secs_f64());
    println!(
        "{:<24} {:>9} {:>9} {:>9} {:>9} {:>5}  verdict",
        "fault", "produced", "stored", "dropped", "rejected", "dups"
    );
    let mut bad = 0;
    for o in &results {
        let verdict = if o.explained() {
            "ok".to_owned()
        } else {
            bad += 1;
            "UNEXPLAINED".to_owned()
        };
        println!(
            "{:<24} {:>9} {:>9} {:>9} {:>9} {:>5}  {verdict}{}{}",
            o.fault,
            o.produced,
            o.stored,
            o.dropped,
            o.rejected,
            o.duplicates,
            if o.note.is_empty() { String::new() } else { format!("  ({})", o.note) },
            o.error.as_ref().map(|e| format!("\n    {e}")).unwrap_or_default()
        );
    }
    println!(
        "produced = stored + dropped + rejected, no duplicates: {}",
        if bad == 0 { "held for every fault" } else { "FAILED" }
    );
    drop(collector);
    if bad == 0 { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::from(1) }
}

/// The first record of `nodes` stored by a transaction that began after `at`, polled through
/// the write port until one is (or `limit` passes): how long after `at` it was stored.
async fn first_stored_after(
    write: &sqlx::postgres::PgConnectOptions,
    nodes: &[&str],
    at: chrono::DateTime<chrono::Utc>,
    limit: Duration,
) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        let first = async {
            let pool = sqlx::PgPool::connect_with(write.clone()).await?;
            let first: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
                "SELECT min(received_at) FROM probe_results WHERE node_id = ANY($1) AND received_at > $2",
            )
            .bind(nodes)
            .bind(at)
            .fetch_one(&pool)
            .await?;
            pool.close().await;
            Ok::<_, sqlx::Error>(first)
        };
        if let Ok(Ok(Some(first))) = tokio::time::timeout(Duration::from_secs(3), first).await {
            return (first - at).to_std().ok();
        }
        pause(Duration::from_millis(250));
    }
    None
}

/// The longest time between consecutive stored probes of `nodes` since `since`: how long
/// ingest stopped while a fault ran (the agents store something every second otherwise).
async fn longest_pause(pool: &sqlx::PgPool, nodes: &[&str], since: chrono::DateTime<chrono::Utc>) -> Duration {
    let gap: Option<f64> = sqlx::query_scalar(
        "SELECT max(extract(epoch FROM received_at - prev))::float8 FROM (
            SELECT received_at, lag(received_at) OVER (ORDER BY received_at) AS prev
            FROM probe_results WHERE node_id = ANY($1) AND received_at >= $2) t",
    )
    .bind(nodes)
    .bind(since)
    .fetch_one(pool)
    .await
    .unwrap();
    Duration::from_secs_f64(gap.unwrap_or(0.0).max(0.0))
}

/// The HA faults, each under two agents' load on a `scripts/pg-ha.sh` cluster with one
/// collector writing through its primary's port and reading its replicas':
/// - "Postgres primary lost": the primary's postmaster SIGKILLed and its data directory
///   deleted; Patroni promotes the synchronous standby;
/// - "Patroni switchover": `patronictl switchover` to the synchronous standby.
///
/// Each is accounted for on the new primary like every other fault, and fails if ingest paused
/// 30 s or more, or an API read went unanswered.
#[derive(Clone, Copy, PartialEq)]
enum HaFault {
    PrimaryLost,
    Switchover,
}

impl HaFault {
    const ALL: [HaFault; 2] = [HaFault::PrimaryLost, HaFault::Switchover];

    fn name(self) -> &'static str {
        match self {
            HaFault::PrimaryLost => "Postgres primary lost",
            HaFault::Switchover => "Patroni switchover",
        }
    }
}

async fn ha_faults(ctx: &Ctx, short: bool) -> Vec<Outcome> {
    if Command::new("patroni").arg("--version").output().is_err() {
        return HaFault::ALL
            .iter()
            .map(|f| not_run(f.name(), "Patroni is not installed (scripts/setup.sh)".into()))
            .collect();
    }
    let ha = tokio::task::block_in_place(railguard_e2e::ha::Ha::up);
    let nodes = ["chaos-ha-1", "chaos-ha-2", "chaos-ha-3", "chaos-ha-4"];
    let [pw_flag, pw_file] = ha.password_args();
    let collector = CollectorProc::start_with(
        &ha.write_url,
        &nodes,
        &["--database-read-url", ha.read_url.as_str(), pw_flag, pw_file],
    );
    let write = ha.options(&ha.write_url);
    let url = collector.url();
    let load = Duration::from_secs(if short { 3 } else { 10 });
    let after = Duration::from_secs(if short { 3 } else { 10 });
    let mut out = Vec::new();
    for (fault, pair) in HaFault::ALL.into_iter().zip(nodes.chunks(2)) {
        let mut agents: Vec<Agent> = pair.iter().map(|n| ctx.agent(n, &url, None, &[], None, &[])).collect();
        pause(load);
        let reads = railguard_e2e::ha::Reads::start(collector.http_port, "/api/v1/fleet");
        let began = chrono::Utc::now();
        // `at`: when the fault is complete (the kill; the switchover's new leader leading).
        let did = tokio::task::block_in_place(|| -> Result<(String, chrono::DateTime<chrono::Utc>), String> {
            let (leader, pid) = ha.leader();
            if fault == HaFault::PrimaryLost {
                let at = chrono::Utc::now();
                kill(Pid::from_raw(pid), Signal::SIGKILL).map_err(|e| format!("killing {leader}: {e}"))?;
                std::fs::remove_dir_all(format!("{}/{leader}/data", ha.cluster))
                    .map_err(|e| format!("deleting {leader}'s data: {e}"))?;
                Ok((format!("{leader} SIGKILLed, its data directory deleted"), at))
            } else {
                let said = ha.run(&["switchover"]);
                let to = said.split_whitespace().find_map(|w| w.strip_prefix("leader=")).unwrap_or("?");
                Ok((format!("{leader} → {to}"), chrono::Utc::now()))
            }
        });
        let at = did.as_ref().map_or(began, |d| d.1);
        let first = first_stored_after(&write, pair, at, Duration::from_secs(120)).await;
        pause(after);
        let seen = reads.finish();
        let (answered, unanswered) = (seen.answered, seen.failed.len());
        let (promoted, _) = tokio::task::block_in_place(|| ha.leader());
        let pool = sqlx::PgPool::connect_with(write.clone()).await.unwrap();
        let stalled = longest_pause(&pool, pair, began - chrono::TimeDelta::seconds(2)).await;
        let note = format!(
            "{}; {promoted} leads; {}ingest paused {:.1} s at most; API reads through the replicas' port {answered} answered, {unanswered} not",
            did.as_ref().map_or("not done", |d| d.0.as_str()),
            match (fault == HaFault::PrimaryLost, first) {
                (true, Some(d)) => format!("first record stored {:.1} s after the kill; ", d.as_secs_f64()),
                _ => String::new(),
            },
            stalled.as_secs_f64(),
        );
        let mut o = settle(ctx, &pool, &collector, fault.name(), &mut agents, note).await;
        pool.close().await;
        o.error = o.error.take().or(match (did, first) {
            (Err(e), _) => Some(e),
            (_, None) => Some("no record was stored after the fault".into()),
            (_, Some(d)) if d.max(stalled) > Duration::from_secs(30) => {
                Some(format!("ingest paused {:.1} s (goal: under 30 s)", d.max(stalled).as_secs_f64()))
            }
            _ if answered == 0 => Some("no API read was answered".into()),
            _ if unanswered > 0 => Some(format!("{unanswered} API reads unanswered, the first: {}", seen.failed[0])),
            _ => None,
        });
        out.push(o);
    }
    drop(collector);
    out
}

/// What a flood of in-line messages got back.
#[derive(Default)]
struct Flood {
    accepted: u64,
    no_room: u64,
    rate_limited: u64,
    error: Option<String>,
}

/// `senders` processes, each holding the simulated GPU device file `device` open, each sending
/// `messages` one-result messages (an errored transfer with a 1000-byte error) to `socket`. Each
/// runs as a uid of its own, as the processes of separate pods are separate senders to the agent
/// (the system's Python: the test's own environment is not theirs to read).
fn inline_flood(socket: &Path, device: &Path, senders: usize, messages: usize) -> Flood {
    const CLIENT: &str = r#"
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rwb")
for line in sys.stdin.buffer:
    f.write(line)
    f.flush()
    print(f.readline().decode().strip())
"#;
    let at = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0);
    let lines: String = (0..messages)
        .map(|i| {
            format!(
                r#"{{"v": 1, "results": [{{"device": 0, "memory": "vram", "request": "flood-{i}", "status": "error", "blocks": 8, "bytes": 8192, "error": "{}", "at_ns": {at}}}]}}"#,
                "x".repeat(1000)
            ) + "\n"
        })
        .collect();
    let children: Vec<_> = (0..senders)
        .map(|i| {
            let mut c = Command::new("sh");
            std::os::unix::process::CommandExt::uid(&mut c, 61_000 + i as u32);
            let mut c = c
                .args(["-c", r#"exec 9<"$0" && exec "$1" -c "$2" "$3""#])
                .arg(device)
                .arg("/usr/bin/python3")
                .arg(CLIENT)
                .arg(socket)
                .env("CUDA_VISIBLE_DEVICES", "3")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut stdin = c.stdin.take().unwrap();
            let lines = lines.clone();
            std::thread::spawn(move || {
                use std::io::Write;
                let _ = stdin.write_all(lines.as_bytes());
            });
            c
        })
        .collect();
    let mut f = Flood::default();
    for c in children {
        let out = match c.wait_with_output() {
            Ok(o) => o,
            Err(e) => {
                f.error = Some(format!("a flooding process: {e}"));
                continue;
            }
        };
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
            f.accepted += v["accepted"].as_u64().unwrap_or(0);
            let errors = v["errors"].to_string();
            f.no_room += u64::from(errors.contains("no room left for in-line reports"));
            f.rate_limited += u64::from(errors.contains("over this sender's report rate"));
        }
    }
    f
}

fn not_run(fault: &str, why: String) -> Outcome {
    Outcome { error: Some(format!("not run: {why}")), ..Outcome::new(fault, String::new()) }
}
