//! A process tree of a test's own: a PID namespace with its own `/proc`, whose first process
//! starts and stops the test's workloads on request. An agent given
//! [`ProcNamespace::proc_root`] as `--proc-root` sees those workloads and nothing else the
//! machine runs, so another test's UCX or NIXL process cannot change what it discovers.
//!
//! How: `unshare --pid --mount-proc --kill-child` starts a launcher as the namespace's PID 1;
//! the namespace's `/proc` is reachable from outside as `/proc/<unshare's pid>/root/proc`
//! (unshare's own mount namespace, where the new proc is mounted). When the handle is dropped
//! the launcher is killed, and the kernel kills every process of the namespace with it.
//! Needs CAP_SYS_ADMIN (tests run as root); without it, a user namespace maps the caller to root.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// PID 1 of the namespace: one JSON request a line on stdin, one JSON answer a line on stdout.
/// It exits when stdin closes, and the namespace ends with it.
const LAUNCHER: &str = r#"
import json, os, subprocess, sys
children = {}
print(json.dumps({"ready": os.getpid()}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["op"] == "spawn":
            out = open(req["stdout"], "wb") if req.get("stdout") else subprocess.DEVNULL
            p = subprocess.Popen(req["argv"], env=req["env"], stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.DEVNULL)
            children[p.pid] = p
            print(json.dumps({"pid": p.pid}), flush=True)
        elif req["op"] == "kill":
            p = children.pop(req["pid"])
            p.kill()
            p.wait()
            print(json.dumps({"killed": req["pid"]}), flush=True)
    except Exception as e:
        print(json.dumps({"error": repr(e)}), flush=True)
"#;

/// A process to start in the namespace.
#[derive(Debug, Clone)]
pub struct Spawn {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    unset: Vec<String>,
    stdout: Option<PathBuf>,
}

impl Spawn {
    /// `program`, with the test's own environment.
    pub fn new(program: impl Into<String>) -> Self {
        Self { argv: vec![program.into()], env: Vec::new(), unset: Vec::new(), stdout: None }
    }

    pub fn arg(mut self, a: impl AsRef<std::ffi::OsStr>) -> Self {
        self.argv.push(a.as_ref().to_string_lossy().into_owned());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(mut self, args: I) -> Self {
        for a in args {
            self = self.arg(a);
        }
        self
    }

    /// Sets `key` in its environment (over the test's own).
    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        self.env.push((key.to_owned(), value.as_ref().to_string_lossy().into_owned()));
        self
    }

    /// Leaves `key` out of its environment (whatever the test's own holds).
    pub fn env_remove(mut self, key: &str) -> Self {
        self.unset.push(key.to_owned());
        self
    }

    /// Its standard output goes to `path` (created); otherwise nowhere.
    pub fn stdout_to(mut self, path: &Path) -> Self {
        self.stdout = Some(path.to_owned());
        self
    }
}

/// A process of the namespace: its pid there (what the namespace's `/proc` lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsProcess {
    pub pid: u32,
}

/// A PID namespace with its own `/proc`, ended when dropped.
#[derive(Debug)]
pub struct ProcNamespace {
    holder: Child,
    channel: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
    proc_root: PathBuf,
}

impl ProcNamespace {
    /// Starts the namespace and waits until its `/proc` is mounted.
    #[allow(clippy::unwrap_used, clippy::expect_used)]
    pub fn start() -> Self {
        let mut cmd = Command::new("unshare");
        if !is_root() {
            cmd.args(["--user", "--map-root-user"]);
        }
        let mut holder = cmd
            .args(["--pid", "--mount-proc", "--kill-child", "--", "python3", "-c", LAUNCHER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare (util-linux) and python3");
        let stdin = holder.stdin.take().unwrap();
        let mut stdout = BufReader::new(holder.stdout.take().unwrap());
        // The launcher runs after unshare mounted the namespace's /proc: its first line says so.
        let ready = read_answer(&mut stdout);
        assert_eq!(ready["ready"], 1, "the launcher is the namespace's PID 1: {ready}");
        let proc_root = PathBuf::from(format!("/proc/{}/root/proc", holder.id()));
        crate::wait::until("the namespace's /proc to list its PID 1", Duration::from_secs(10), || {
            std::fs::read(proc_root.join("1/cmdline")).map_err(|e| format!("{}: {e}", proc_root.display()))
        });
        Self { holder, channel: Mutex::new((stdin, stdout)), proc_root }
    }

    /// The namespace's `/proc`, to give an agent as `--proc-root`.
    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// Starts `s` in the namespace.
    #[allow(clippy::unwrap_used)]
    pub fn spawn(&self, s: Spawn) -> NsProcess {
        let mut env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
        env.extend(s.env);
        for k in &s.unset {
            env.remove(k);
        }
        let req = serde_json::json!({
            "op": "spawn",
            "argv": s.argv,
            "env": env,
            "stdout": s.stdout.map(|p| p.to_string_lossy().into_owned()),
        });
        let answer = self.ask(&req);
        let pid = answer["pid"].as_u64().unwrap_or_else(|| panic!("spawn {:?}: {answer}", req["argv"]));
        NsProcess { pid: u32::try_from(pid).unwrap() }
    }

    /// Kills `p` and waits for it to be gone.
    pub fn kill(&self, p: NsProcess) {
        let answer = self.ask(&serde_json::json!({"op": "kill", "pid": p.pid}));
        assert_eq!(answer["killed"], p.pid, "kill {}: {answer}", p.pid);
    }

    #[allow(clippy::unwrap_used)]
    fn ask(&self, req: &serde_json::Value) -> serde_json::Value {
        let mut ch = self.channel.lock().unwrap();
        writeln!(ch.0, "{req}").unwrap();
        ch.0.flush().unwrap();
        read_answer(&mut ch.1)
    }
}

impl Drop for ProcNamespace {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

#[allow(clippy::unwrap_used)]
fn read_answer(r: &mut BufReader<ChildStdout>) -> serde_json::Value {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("the namespace's launcher answered {line:?}: {e}"))
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:").map(|v| v.split_whitespace().next() == Some("0"))))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_lists_its_own_processes_and_nothing_else() {
        let ns = ProcNamespace::start();
        let p = ns.spawn(Spawn::new("sleep").arg("30").env("MARK", "ns-test"));
        let listed = || -> Vec<u32> {
            std::fs::read_dir(ns.proc_root())
                .unwrap()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        };
        crate::wait::until("the spawned process in the namespace's /proc", Duration::from_secs(10), || {
            let pids = listed();
            if pids.contains(&p.pid) { Ok(()) } else { Err(format!("{pids:?}")) }
        });
        let mut pids = listed();
        pids.sort_unstable();
        assert_eq!(pids, [1, p.pid], "only the launcher and its child");
        // Its environment as given: read once the kernel has set it up (the launcher hears of the
        // exec a moment before the new image's environment is in place).
        crate::wait::until("the spawned process's environment", Duration::from_secs(10), || {
            let env = std::fs::read(ns.proc_root().join(format!("{}/environ", p.pid))).unwrap_or_default();
            if env.split(|b| *b == 0).any(|v| v == b"MARK=ns-test") {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&env).into_owned())
            }
        });
        ns.kill(p);
        assert!(!listed().contains(&p.pid), "killed and reaped");
    }
}
