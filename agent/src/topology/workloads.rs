//! The workloads on this node and the NICs they select: every process that maps UCX or NIXL
//! (`/proc/PID/maps`), with the selection its environment makes (`UCX_NET_DEVICES`,
//! `NCCL_IB_HCA`) for the GPUs it uses (`CUDA_VISIBLE_DEVICES`). With the host's process table
//! (a DaemonSet with `hostPID: true`, or systemd), the agent probes the pair each workload
//! really uses, and a pin applied to a workload moves its GPU's pair at the next reading.

use std::collections::BTreeMap;

use super::SysRoot;
use super::predict::{IbHca, NetDevices, from_environ};

/// A process that moves data with UCX or NIXL, and what it selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub pid: u32,
    /// The library that made it a workload (a file name from its maps, e.g. `libnixl.so`).
    pub library: String,
    pub ucx: NetDevices,
    pub nccl: Option<IbHca>,
    /// `CUDA_VISIBLE_DEVICES` as given: GPU indices or `GPU-…` UUIDs; None: unset (every GPU).
    pub cuda_visible: Option<Vec<String>>,
    /// Where its NIXL keeps its telemetry rings: `NIXL_TELEMETRY_DIR` (absolute), when
    /// `NIXL_TELEMETRY_ENABLE` turns telemetry on.
    pub nixl_telemetry_dir: Option<String>,
}

/// The value of `name` in an environment block (`/proc/PID/environ`).
pub fn env_var<'a>(env: &'a [u8], name: &str) -> Option<&'a str> {
    env.split(|b| *b == 0)
        .filter_map(|v| std::str::from_utf8(v).ok())
        .find_map(|v| v.strip_prefix(name)?.strip_prefix('='))
}

/// `CUDA_VISIBLE_DEVICES` of an environment block, as a list.
fn cuda_visible(env: &[u8]) -> Option<Vec<String>> {
    env_var(env, "CUDA_VISIBLE_DEVICES")
        .map(|v| v.split(',').map(|d| d.trim().to_owned()).filter(|d| !d.is_empty()).collect())
}

/// `NIXL_TELEMETRY_DIR` of an environment block where `NIXL_TELEMETRY_ENABLE` is on (NIXL's
/// spellings: y/yes/on/true/enable/1, any case).
fn nixl_telemetry_dir(env: &[u8]) -> Option<String> {
    let on = env_var(env, "NIXL_TELEMETRY_ENABLE")
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "y" | "yes" | "on" | "true" | "enable" | "1"));
    env_var(env, "NIXL_TELEMETRY_DIR").filter(|d| on && d.starts_with('/')).map(str::to_owned)
}

/// Library names that make a process a KV-transfer workload (renamed wheel copies included:
/// `libucp-8f1c2a.so.0` in `nixl_cu12.libs/`).
fn is_transfer_library(file: &str) -> bool {
    ["libucp", "libuct", "libnixl"].iter().any(|p| file.starts_with(p)) && file.contains(".so")
}

/// The processes under `proc_` that map UCX or NIXL, except railguard's own agents (their
/// probes map UCX too, and are not the workload).
pub fn discover(proc_: &SysRoot) -> Vec<Workload> {
    let me = std::process::id();
    let mut out = Vec::new();
    for name in proc_.list("").unwrap_or_default() {
        let Ok(pid) = name.parse::<u32>() else { continue };
        if pid == me || proc_.read(format!("{pid}/comm")).is_ok_and(|c| c.trim() == "railguard-agent") {
            continue;
        }
        let Ok(maps) = proc_.read(format!("{pid}/maps")) else { continue };
        let Some(library) = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter_map(|p| p.rsplit('/').next())
            .find(|f| is_transfer_library(f))
            .map(str::to_owned)
        else {
            continue;
        };
        let Ok(env) = proc_.read_bytes(format!("{pid}/environ")) else { continue };
        let (ucx, nccl) = from_environ(&env);
        out.push(Workload {
            pid,
            library,
            ucx,
            nccl,
            cuda_visible: cuda_visible(&env),
            nixl_telemetry_dir: nixl_telemetry_dir(&env),
        });
    }
    out
}

/// The one GPU process `pid` uses by its `CUDA_VISIBLE_DEVICES` (any process: a verbs
/// consumer need not map UCX), or None when it names none or several, or is unreadable.
pub fn gpu_of_pid(proc_: &SysRoot, pid: u32, uuids: &[(u32, String)]) -> Option<u32> {
    let env = proc_.read_bytes(format!("{pid}/environ")).ok()?;
    let list = cuda_visible(&env)?;
    let (ucx, nccl) = from_environ(&[]);
    let w = Workload { pid, library: String::new(), ucx, nccl, cuda_visible: Some(list), nixl_telemetry_dir: None };
    match gpus_of(&w, uuids).as_slice() {
        [g] => Some(*g),
        _ => None,
    }
}

/// Which GPUs (the node's indices) a workload uses: `CUDA_VISIBLE_DEVICES` entries as CUDA
/// ordinals, positions in PCI bus order (as with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, what serving
/// stacks set), or as GPU UUIDs; `uuids` is the node's GPUs in bus order (index, UUID from
/// NVML). Unset: every GPU.
pub fn gpus_of(w: &Workload, uuids: &[(u32, String)]) -> Vec<u32> {
    match &w.cuda_visible {
        None => uuids.iter().map(|(i, _)| *i).collect(),
        Some(list) => list
            .iter()
            .filter_map(|d| match d.parse::<usize>() {
                Ok(ordinal) => uuids.get(ordinal).map(|(g, _)| *g),
                Err(_) => uuids.iter().find(|(_, u)| !u.is_empty() && u == d).map(|(g, _)| *g),
            })
            .collect(),
    }
}

/// What each GPU's workloads select: GPU index → every distinct selection of the processes
/// using it, the lowest pid's first (the one the GPU's predicted NIC follows). A GPU claimed by
/// workloads that select differently keeps them all (each pair is probed and judged), and says
/// so in a note.
pub fn per_gpu(
    workloads: &[Workload],
    uuids: &[(u32, String)],
) -> (BTreeMap<u32, Vec<super::WorkloadSelection>>, Vec<String>) {
    let mut map: BTreeMap<u32, Vec<super::WorkloadSelection>> = BTreeMap::new();
    let mut notes = Vec::new();
    let mut sorted: Vec<&Workload> = workloads.iter().collect();
    sorted.sort_by_key(|w| w.pid);
    for w in sorted {
        for g in gpus_of(w, uuids) {
            let kept = map.entry(g).or_default();
            if kept.iter().any(|k| k.ucx == w.ucx && k.nccl == w.nccl) {
                continue;
            }
            if let Some(first) = kept.first() {
                notes.push(format!(
                    "GPU{g} is used by processes {} and {} with different NIC selections: each one's NIC is probed and judged",
                    first.pid, w.pid
                ));
            }
            kept.push(super::WorkloadSelection { pid: w.pid, ucx: w.ucx.clone(), nccl: w.nccl.clone() });
        }
    }
    (map, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_with(dir: &std::path::Path, pid: u32, lib: &str, env: &[&str]) {
        let d = dir.join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("maps"), format!("7f00-7f01 r-xp 00000000 08:01 1 /opt/x/{lib}\n")).unwrap();
        std::fs::write(d.join("environ"), env.join("\0")).unwrap();
    }

    #[test]
    fn workloads_and_the_gpus_they_select_for() {
        let d = tempfile::tempdir().unwrap();
        proc_with(d.path(), 100, "libucp.so.0.0.0", &["UCX_NET_DEVICES=mlx5_1:1", "CUDA_VISIBLE_DEVICES=3"]);
        proc_with(d.path(), 101, "libnixl.so", &["CUDA_VISIBLE_DEVICES=GPU-aaaa,5"]);
        proc_with(d.path(), 102, "libc.so.6", &["UCX_NET_DEVICES=mlx5_7:1"]); // not a transfer workload
        proc_with(d.path(), 103, "libucp-8f1c2a.so.0", &["UCX_NET_DEVICES=mlx5_2:1", "CUDA_VISIBLE_DEVICES=3"]);
        let ws = discover(&SysRoot::new(d.path()));
        assert_eq!(ws.iter().map(|w| w.pid).collect::<Vec<_>>(), [100, 101, 103]);
        let uuids: Vec<(u32, String)> =
            (0..8).map(|i| (i, if i == 4 { "GPU-aaaa".into() } else { String::new() })).collect();
        assert_eq!(gpus_of(&ws[1], &uuids), [4, 5], "a UUID and an index");
        let (map, notes) = per_gpu(&ws, &uuids);
        // GPU3: both workloads kept, the lowest pid first.
        assert_eq!(map[&3].iter().map(|w| w.pid).collect::<Vec<_>>(), [100, 103]);
        assert_eq!(map[&3][0].ucx, NetDevices::parse("mlx5_1:1"));
        assert_eq!(map[&3][1].ucx, NetDevices::parse("mlx5_2:1"));
        assert_eq!(map[&4].len(), 1);
        assert_eq!(map[&4][0].ucx, NetDevices::Auto);
        assert_eq!(notes.len(), 1, "GPU3 claimed twice with different pins: {notes:?}");
        assert!(notes[0].contains("processes 100 and 103"), "{notes:?}");
        assert!(!map.contains_key(&0));
        // A GPU has left the bus: the node's indices are no longer positions, and a number in
        // CUDA_VISIBLE_DEVICES is a position (CUDA's ordinal), never an index.
        let kept: Vec<(u32, String)> = vec![(1, "GPU-b".into()), (2, String::new()), (3, String::new())];
        assert_eq!(gpus_of(&ws[0], &kept), Vec::<u32>::new(), "ordinal 3 is beyond the three GPUs");
        let w = Workload { cuda_visible: Some(vec!["0".into(), "GPU-b".into(), "2".into()]), ..ws[0].clone() };
        assert_eq!(gpus_of(&w, &kept), [1, 1, 3]);
    }
}
