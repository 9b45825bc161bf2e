//! eBPF on this machine's real kernel (as root): the tracepoints attach or are reported
//! absent, and the UCX uprobe decodes crafted error CQEs from a test library with UCX's
//! signature, each error once.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::process::Command;
use std::time::Duration;

use railguard_agent::signals::ebpf::Probes;

fn gcc(args: &[&str]) {
    let st = Command::new("cc").args(args).status().unwrap();
    assert!(st.success(), "cc {args:?}");
}

/// Runs `watch --json` with `args` for 8 s, runs `exe` once it follows its sources (its eBPF
/// programs loaded and attached), returns the events of `kind` it printed.
fn watch_while_running(args: &[&std::ffi::OsStr], exe: &std::path::Path, kind: &str) -> Vec<serde_json::Value> {
    use std::io::BufRead;
    let mut watch = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
        .args(["watch", "--json", "--seconds", "8", "--kmsg", "/dev/null"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    let mut stderr = std::io::BufReader::new(watch.stderr.take().unwrap());
    while !said.contains("watch: following") {
        assert!(stderr.read_line(&mut said).unwrap() > 0, "watch ended before following its sources: {said}");
    }
    assert!(Command::new(exe).status().unwrap().success());
    let out = watch.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        // The uprobes' events: a NIXL process elsewhere on the machine reports through its own
        // telemetry ring (another source) whatever it does.
        .filter(|e: &serde_json::Value| e["kind"] == kind && e["source"] == "ebpf_uprobe")
        .collect()
}

/// Builds the fake UCX library as `lib_name` in `dir` and `caller` (one of tests/ucx_fake/*.c)
/// linked against it; returns (library, executable).
fn build_fake(dir: &std::path::Path, lib_name: &str, caller: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ucx_fake");
    let lib = dir.join(lib_name);
    gcc(&["-O2", "-shared", "-fPIC", "-o", lib.to_str().unwrap(), &format!("{src}/uct_fake.c")]);
    let exe = dir.join(caller);
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    gcc(&["-O2", "-o", exe.to_str().unwrap(), &format!("{src}/{caller}.c"), lib.to_str().unwrap(), &rpath]);
    (lib, exe)
}

/// The UCX error-CQE events drained from `probes` until `want` arrived, and one more drain: the
/// caller has exited, so every event its calls made is in the buffer already, a duplicate too.
fn ucx_errors(probes: &mut Probes, want: usize) -> Vec<railguard_schema::SignalEvent> {
    let mut events = Vec::new();
    let take = |p: &mut Probes, e: &mut Vec<_>| {
        e.extend(p.drain().into_iter().filter(|e| e.kind == railguard_schema::SignalKind::UcxErrorCqe));
    };
    railguard_testkit::until(&format!("{want} UCX error events"), Duration::from_secs(30), || {
        take(probes, &mut events);
        if events.len() >= want { Ok(()) } else { Err(events.len()) }
    });
    take(probes, &mut events);
    events
}

#[test]
fn tracepoints_attach_and_the_ucx_uprobe_decodes_each_error_once() {
    let mut probes = Probes::load().expect("eBPF needs root and a kernel with BPF (tests run as root)");
    // This kernel has iommu:io_page_fault; what it lacks is reported with a reason.
    assert!(probes.report.attached.iter().any(|a| a == "iommu:io_page_fault"), "{:?}", probes.report);
    for (tp, why) in &probes.report.skipped {
        assert!(!why.is_empty(), "{tp} skipped without a reason");
    }
    assert_eq!(probes.report.attached.len() + probes.report.skipped.len(), 3);

    let d = tempfile::tempdir().unwrap();
    let (lib, exe) = build_fake(d.path(), "libuct_ib_mlx5.so.0", "caller");
    assert!(probes.attach_ucx(&lib).unwrap());
    assert!(!probes.attach_ucx(&lib).unwrap(), "attached once per library");

    let st = Command::new(&exe).status().unwrap();
    assert!(st.success());
    let events = ucx_errors(&mut probes, 3);
    assert_eq!(events.len(), 3, "6 calls, 3 errors: {events:#?}");
    let a = &events[0].attrs;
    assert_eq!(a["syndrome"], "0x4");
    assert_eq!(a["syndrome_name"], "local protection error");
    assert_eq!(a["vendor_syndrome"], "0x32");
    assert_eq!(a["hw_syndrome"], "0x1");
    assert_eq!(a["hw_syndrome_type"], "3");
    assert_eq!(a["qpn"], "0x2c8");
    assert_eq!(a["opcode"], "0xd");
    assert_eq!(a["wqe_counter"], "7");
    assert_eq!(a["side"], "requester");
    assert_eq!(a["log_level"], "5", "the first of UCX's two calls is kept");
    assert_eq!(a["library"], lib.canonicalize().unwrap().display().to_string());
    assert!(!a.contains_key("untrusted"), "a root-owned library in root-owned directories: {a:?}");
    assert_eq!(events[1].attrs["syndrome_name"], "remote access error");
    assert_eq!(events[2].attrs["syndrome_name"], "transport retry counter exceeded");
    // The kernel's own statistics count the uprobe's six runs.
    let cost = probes.costs().into_iter().find(|c| c.program == "ucx_completion_with_err").unwrap();
    assert_eq!(cost.runs, 6, "{cost:?}");
    assert!(cost.run_time_ns > 0);
}

#[test]
fn watch_json_shows_each_ucx_error_once_with_its_fields() {
    let d = tempfile::tempdir().unwrap();
    let (lib, exe) = build_fake(d.path(), "libuct_ib_mlx5.so.0", "caller");
    let events = watch_while_running(&["--ucx-lib".as_ref(), lib.as_os_str()], &exe, "ucx_error_cqe");
    assert_eq!(events.len(), 3, "{events:#?}");
    assert_eq!(events[0]["source"], "ebpf_uprobe");
    assert_eq!(events[0]["attrs"]["syndrome_name"], "local protection error");
    assert_eq!(events[0]["attrs"]["qpn"], "0x2c8");
    assert_eq!(events[1]["attrs"]["vendor_syndrome"], "0x88");
    assert_eq!(events[2]["attrs"]["wqe_counter"], "9");
    assert!(events[0]["detail"].as_str().unwrap().contains("requester local protection error"));
}

#[test]
fn a_configured_return_status_target_reports_negative_returns() {
    let d = tempfile::tempdir().unwrap();
    let (lib, exe) = build_fake(d.path(), "libnixl_fake.so", "status_caller");
    let targets = d.path().join("targets.json");
    std::fs::write(&targets, r#"[{"glob": "libnixl*", "symbol": "nixl_fake_post_xfer", "decoder": "return_status"}]"#)
        .unwrap();
    let events = watch_while_running(
        &["--uprobe-targets".as_ref(), targets.as_os_str(), "--uprobe-file".as_ref(), lib.as_os_str()],
        &exe,
        "transfer_status_error",
    );
    assert_eq!(events.len(), 2, "{events:#?}");
    assert_eq!(events[0]["attrs"]["status"], "-3");
    assert_eq!(events[1]["attrs"]["status"], "-7");
    assert_eq!(events[0]["attrs"]["symbol"], "nixl_fake_post_xfer");
}

#[test]
fn a_library_an_unprivileged_user_owns_yields_only_untrusted_events() {
    use std::os::unix::fs::PermissionsExt;
    let mut probes = Probes::load().expect("eBPF needs root");
    let d = tempfile::tempdir().unwrap();
    let (lib, exe) = build_fake(d.path(), "libuct_ib_mlx5.so.0", "caller");
    // A user who can write the library decides what the probed code does: a forged "NIC error".
    std::os::unix::fs::chown(&lib, Some(65534), Some(65534)).unwrap();
    assert!(probes.attach_ucx(&lib).unwrap());
    assert!(probes.report.attached.iter().any(|a| a.contains("untrusted: owned by uid 65534")), "{:?}", probes.report);
    assert!(Command::new(&exe).status().unwrap().success());
    let events = ucx_errors(&mut probes, 3);
    assert_eq!(events.len(), 3, "{events:#?}");
    for e in &events {
        assert_eq!(e.attrs["untrusted"], "owned by uid 65534", "{e:?}");
        assert!(e.summary.starts_with("[untrusted: library owned by uid 65534]"), "{}", e.summary);
    }

    // A library every user can write is not attached at all.
    let d2 = tempfile::tempdir().unwrap();
    let (open_lib, _) = build_fake(d2.path(), "libuct_ib_mlx5.so.0", "caller");
    std::fs::set_permissions(&open_lib, std::fs::Permissions::from_mode(0o666)).unwrap();
    let err = probes.attach_ucx(&open_lib).unwrap_err();
    use railguard_agent::signals::ebpf::{EbpfError, targets::NotAttachable};
    assert!(matches!(&err, EbpfError::NotAttachable { source: NotAttachable::WorldWritable, .. }), "{err}");
}

/// A library mapped by a process in another mount namespace (a container's view of the
/// filesystem): the agent finds it in the process's maps, attaches through `/proc/PID/root`
/// (its own view of that path holds nothing), and decodes the errors of a program there.
#[test]
fn a_library_in_another_mount_namespace_is_attached_through_the_process_root() {
    use std::io::{BufRead, Write};
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    std::fs::create_dir(&src).unwrap();
    build_fake(&src, "libuct_ib_mlx5.so.0", "caller");
    // An empty directory here; in the namespace, the libraries are mounted on it.
    let at = d.path().join("mnt");
    std::fs::create_dir(&at).unwrap();
    let py = format!(
        "import ctypes,subprocess,sys; ctypes.CDLL('{at}/libuct_ib_mlx5.so.0'); print('ready', flush=True); sys.stdin.readline(); subprocess.run(['{at}/caller'])",
        at = at.display()
    );
    let script = format!("mount --bind {} {} && exec python3 -c \"{py}\"", src.display(), at.display());
    let mut ns = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(ns.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    assert!(!at.join("libuct_ib_mlx5.so.0").exists(), "outside the namespace the path holds nothing");

    let mut probes = Probes::load().expect("eBPF needs root");
    probes.scan_processes();
    let want = format!("/proc/{}/root{}/libuct_ib_mlx5.so.0", ns.id(), at.display());
    assert!(
        probes.report.attached.iter().any(|a| a.starts_with(&format!("uprobe:{want}:"))),
        "{want}: {:?}",
        probes.report
    );

    ns.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(ns.wait().unwrap().success());
    let events = ucx_errors(&mut probes, 3);
    assert_eq!(events.len(), 3, "{events:#?}");
    assert_eq!(events[0].attrs["library"], want);
    assert!(
        !events[0].attrs.contains_key("untrusted"),
        "root-owned, under root-owned directories: {:?}",
        events[0].attrs
    );
}
