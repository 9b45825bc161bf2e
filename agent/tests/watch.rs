//! `watch` on this machine's real kernel log and on fixture NIC counters.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use railguard_agent::signals::counters::CounterPoller;
use railguard_agent::topology::{SysRoot, Topology, fixture};

fn seed() -> (tempfile::TempDir, Topology) {
    let d = tempfile::tempdir().unwrap();
    fixture::seed_kvm_guest().write(&d.path().join("node")).unwrap();
    let t = Topology::discover(&SysRoot::new(d.path().join("node/sys")), &SysRoot::new(d.path().join("node/proc")));
    (d, t)
}

/// What `watch` prints on stderr once every source is open.
const READY: &str = "watch: following";

/// A `watch` run over the fixture node, its events on stdout and its log on stderr. Its stdout
/// is drained as it comes (the kernel log may hold many matching lines from earlier runs: a
/// pipe left unread would fill and stop it mid-write).
struct Watch {
    child: std::process::Child,
    stderr: std::io::BufReader<std::process::ChildStderr>,
    stdout: std::thread::JoinHandle<Vec<u8>>,
    said: String,
}

impl Watch {
    fn start(d: &tempfile::TempDir, extra: &[&str]) -> Watch {
        let mut child = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
            .args(["watch", "--json", "--sysfs-root"])
            .arg(d.path().join("node/sys"))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut out = child.stdout.take().unwrap();
        let stdout = std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = Vec::new();
            out.read_to_end(&mut buf).unwrap();
            buf
        });
        Watch { child, stderr, stdout, said: String::new() }
    }

    /// Blocks until it says it follows every source (or panics with what it said instead).
    fn wait_ready(&mut self) {
        use std::io::BufRead;
        loop {
            let mut line = String::new();
            let n = self.stderr.read_line(&mut line).unwrap();
            assert!(n > 0, "watch ended without following its sources: {}", self.said);
            self.said.push_str(&line);
            if line.starts_with(READY) {
                return;
            }
        }
    }

    /// Waits for it to end on its own (`--seconds`); its events. It must have followed its
    /// sources first, so an empty result means nothing was there.
    fn events(mut self) -> Vec<serde_json::Value> {
        use std::io::Read;
        let mut rest = String::new();
        self.stderr.read_to_string(&mut rest).unwrap();
        self.said.push_str(&rest);
        let status = self.child.wait().unwrap();
        let stdout = self.stdout.join().unwrap();
        assert!(status.success(), "{}", self.said);
        assert!(self.said.contains(READY), "watch never followed its sources: {}", self.said);
        String::from_utf8_lossy(&stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

#[test]
fn real_kernel_lines_become_typed_attributed_events_once() {
    let (d, t) = seed();
    let marker = format!("railguard-test-{}", uuid::Uuid::new_v4());
    let gpu0 = t.gpus[0].gpu.bdf;
    let nic3 = t.nics[3].nic.bdf;
    let state = d.path().join("kmsg.state");
    let mut child = Watch::start(&d, &["--seconds", "8", "--state-file", state.to_str().unwrap()]);
    child.wait_ready();
    let mut kmsg = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .expect("tests run as root and write real lines to /dev/kmsg");
    let gpu_short = format!("{:04x}:{:02x}:{:02x}", gpu0.domain, gpu0.bus, gpu0.device);
    for line in [
        format!(
            "<3>NVRM: Xid (PCI:{gpu_short}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus. {marker}"
        ),
        format!(
            "<3>mlx5_core {nic3} mlx5_3: Error cqe on cqn 0x4a1, ci 0x1f, qn 0x2c8, opcode 0xd, syndrome 0x4, vendor syndrome 0x32 {marker}"
        ),
        format!(
            "<3>DMAR: [DMA Read NO_PASID] Request device [{:02x}:{:02x}.0] fault addr 0x0 [fault reason 0x06] PTE Read access is not set {marker}",
            nic3.bus, nic3.device
        ),
        format!("<3>NVRM: Xid (PCI:broken {marker}"),
    ] {
        kmsg.write_all(line.as_bytes()).unwrap();
    }
    let events: Vec<serde_json::Value> =
        child.events().into_iter().filter(|e| e["detail"].as_str().unwrap_or("").contains(&marker)).collect();
    assert_eq!(events.len(), 3, "{events:#?}");
    let xid = &events[0];
    assert_eq!((xid["kind"].as_str(), xid["source"].as_str()), (Some("gpu_xid"), Some("kmsg")));
    assert_eq!(xid["gpu"], 0);
    assert_eq!(xid["attrs"]["xid"], "79");
    assert_eq!(xid["bdf"], gpu0.to_string());
    let cqe = &events[1];
    assert_eq!(cqe["kind"], "mlx5_error_cqe");
    assert_eq!(cqe["nic"], "mlx5_3");
    assert_eq!(cqe["attrs"]["syndrome_name"], "local protection error");
    let dmar = &events[2];
    assert_eq!(dmar["kind"], "dmar_fault");
    assert_eq!(dmar["nic"], "mlx5_3", "the domain-less address resolved against the node's devices");

    // A restart with the same state file does not report them again (its first round reads the
    // whole kernel log from the saved position, before it says it follows).
    let again = Watch::start(&d, &["--seconds", "2", "--state-file", state.to_str().unwrap()]).events();
    assert!(!again.iter().any(|e| e["detail"].as_str().unwrap_or("").contains(&marker)), "{again:?}");
}

#[test]
fn hw_counter_increases_in_a_fixture_tree_become_events() {
    let (d, _) = seed();
    let mut child = Watch::start(&d, &["--seconds", "8", "--kmsg", "/dev/null", "--counter-interval-secs", "1"]);
    // The counters' baseline is read: an increase from here on is an event.
    child.wait_ready();
    let counter = d.path().join("node/sys/class/infiniband/mlx5_2/ports/1/hw_counters/req_cqe_error");
    std::fs::write(&counter, "7\n").unwrap();
    let events = child.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["kind"], "nic_counter_increase");
    assert_eq!(events[0]["source"], "nic_counter");
    assert_eq!(events[0]["nic"], "mlx5_2");
    assert_eq!(events[0]["attrs"]["counter"], "req_cqe_error");
    assert_eq!(events[0]["attrs"]["delta"], "7");
}

#[test]
fn counter_resets_and_vanished_devices() {
    let (d, t) = seed();
    let sys = SysRoot::new(d.path().join("node/sys"));
    let nics: Vec<(String, Option<railguard_schema::Bdf>)> =
        t.nics.iter().map(|n| (n.nic.name.clone(), Some(n.nic.bdf))).collect();
    let mut p = CounterPoller::default();
    assert!(p.poll(&sys, &nics).is_empty(), "the first poll is the baseline");
    let c = d.path().join("node/sys/class/infiniband/mlx5_0/ports/1/hw_counters/local_ack_timeout_err");
    std::fs::write(&c, "100").unwrap();
    assert_eq!(p.poll(&sys, &nics)[0].attrs["delta"], "100");
    std::fs::write(&c, "3").unwrap();
    let ev = p.poll(&sys, &nics);
    assert_eq!((ev[0].attrs["delta"].as_str(), ev[0].attrs.get("reset").map(String::as_str)), ("3", Some("true")));
    std::fs::write(&c, "garbage").unwrap();
    assert!(p.poll(&sys, &nics).is_empty());
    std::fs::remove_file(d.path().join("node/sys/class/infiniband/mlx5_0")).unwrap();
    assert!(p.poll(&sys, &nics).is_empty(), "a vanished device is skipped");
}

#[test]
fn attribution_follows_the_shared_topology_when_the_node_changes() {
    use railguard_agent::service::signals::{SignalSettings, follow};
    use railguard_agent::stop::Stop;
    use railguard_agent::topology::TopologySource;
    use railguard_agent::topology::shared::SharedTopology;
    use std::sync::{Arc, Mutex};

    // The node starts without GPUs (an empty tree); the signal loop follows the real kernel log.
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("node/sys")).unwrap();
    let source = TopologySource { sysfs_root: d.path().join("node/sys"), ..TopologySource::this_machine() };
    let topology = SharedTopology::discover(source, None, Vec::new()).unwrap();
    assert!(topology.current().topology.gpus.is_empty());
    let stop = Stop::new();
    let seen: Arc<Mutex<Vec<railguard_schema::SignalEvent>>> = Arc::default();
    let settings = SignalSettings { ebpf: false, ..SignalSettings::default() };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let loop_thread = {
        let (topology, stop, seen) = (topology.clone(), stop.clone(), seen.clone());
        std::thread::spawn(move || {
            follow(
                &settings,
                &topology,
                None,
                &stop,
                &mut |ev| {
                    seen.lock().unwrap().push(ev);
                    true
                },
                &mut || ready_tx.send(()).unwrap(),
            )
        })
    };
    ready_rx
        .recv_timeout(railguard_testkit::scaled(Duration::from_secs(60)))
        .expect("the signal loop follows its sources");
    let marker = format!("railguard-refresh-{}", uuid::Uuid::new_v4());
    let gpu0 = {
        let probe = tempfile::tempdir().unwrap();
        fixture::seed_kvm_guest().write(probe.path()).unwrap();
        Topology::discover(&SysRoot::new(probe.path().join("sys")), &SysRoot::new(probe.path().join("proc"))).gpus[0]
            .gpu
            .bdf
    };
    let xid = |tag: &str| {
        let line = format!(
            // Ends with a newline, as drivers' lines do: the kernel makes a record readable from
            // /dev/kmsg only once it is finished.
            "<3>NVRM: Xid (PCI:{:04x}:{:02x}:{:02x}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus. {marker}-{tag}\n",
            gpu0.domain, gpu0.bus, gpu0.device
        );
        std::fs::OpenOptions::new().write(true).open("/dev/kmsg").unwrap().write_all(line.as_bytes()).unwrap();
    };
    let event = |tag: &str| {
        let want = format!("{marker}-{tag}");
        railguard_testkit::until(&format!("the event of {want}"), Duration::from_secs(30), || {
            let seen = seen.lock().unwrap();
            seen.iter()
                .find(|e| e.summary.contains(&want))
                .cloned()
                .ok_or_else(|| format!("{} events; last: {:?}", seen.len(), seen.last().map(|e| &e.summary)))
        })
    };

    xid("before");
    assert_eq!(event("before").gpu, None, "no GPU at that address yet");

    // The GPUs appear (a driver reload, hot-plug): one refresh of the shared topology later, the
    // signal loop attributes the same line to GPU0 without a restart.
    fixture::seed_kvm_guest().write(&d.path().join("node")).unwrap();
    assert!(topology.refresh().unwrap(), "the node changed");
    // A line written after the refresh, and its event seen: the loop's read of it ended after
    // the refresh, so its next round (which checks the generation before it reads) is what
    // reads the line written after that.
    xid("sync");
    event("sync");
    xid("after");
    assert_eq!(event("after").gpu, Some(0));

    stop.stop();
    loop_thread.join().unwrap();
}

#[test]
fn the_kernel_log_position_is_saved_only_once_its_events_are_spooled() {
    use railguard_agent::service::signals::{SignalSettings, follow};
    use railguard_agent::stop::Stop;
    use railguard_agent::topology::TopologySource;
    use railguard_agent::topology::shared::SharedTopology;

    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("node/sys")).unwrap();
    let source = TopologySource { sysfs_root: d.path().join("node/sys"), ..TopologySource::this_machine() };
    let topology = SharedTopology::discover(source, None, Vec::new()).unwrap();
    let state = d.path().join("kmsg-state.json");
    let marker = format!("railguard-position-{}", uuid::Uuid::new_v4());
    let line = format!(
        "<3>NVRM: Xid (PCI:0000:99:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus. {marker}\n"
    );
    std::fs::OpenOptions::new().write(true).open("/dev/kmsg").unwrap().write_all(line.as_bytes()).unwrap();

    // Runs the signal loop until the marker's event was handed over (`spooled` is what the
    // spool answers), and says how often it was.
    let run = |spooled: bool| -> usize {
        let stop = Stop::new();
        let (topology, state, marker, stop2) = (topology.clone(), state.clone(), marker.clone(), stop.clone());
        // The first round reads every kernel-log record after the saved position: the loop
        // stops once it is done (or at the marker's event).
        let t = std::thread::spawn(move || {
            let mut n = 0;
            let settings = SignalSettings { ebpf: false, ..SignalSettings::default() };
            let stop3 = stop2.clone();
            follow(
                &settings,
                &topology,
                Some(&state),
                &stop2,
                &mut |ev| {
                    if ev.summary.contains(&marker) {
                        n += 1;
                        stop3.stop();
                    }
                    spooled
                },
                &mut || stop2.stop(),
            );
            n
        });
        railguard_testkit::until_true("the signal loop's first round", Duration::from_secs(60), || t.is_finished());
        stop.stop();
        t.join().unwrap()
    };
    // The spool fails: the event is read but the position is not saved...
    assert_eq!(run(false), 1);
    assert!(!state.exists(), "position saved though nothing was spooled");
    // ...so the next run reads the line again, and this time the position moves past it...
    assert_eq!(run(true), 1, "the line was lost");
    assert!(state.exists());
    // ...and a run after that does not report it again.
    assert_eq!(run(true), 0);
}
