//! Which GPU and NIC a reporting process's transfers used, and whether its NIC moved them.
//!
//! - GPU: only one the process holds open ([`super::holds`]: its `/dev/nvidiaN` descriptors, as
//!   the kernel lists them). The environment only orders the held GPUs the way CUDA numbers
//!   them: `NVIDIA_VISIBLE_DEVICES` (the container's GPUs, as the device plugin sets it; unset
//!   or `all`: every GPU of the node) in PCI order, then `CUDA_VISIBLE_DEVICES` (indices into
//!   that list, or `GPU-…` UUIDs or unique prefixes) selects and reorders. A result's CUDA
//!   device ordinal that lands on a GPU the process does not hold is refused ([`Unbacked`]),
//!   never moved to another GPU; a process holding exactly one GPU whose environment cannot be
//!   read as a list reports for that GPU as device 0.
//! - NIC: the NIC the agent predicts for that GPU under the process's own selection
//!   (`UCX_NET_DEVICES`, …: the topology's per-GPU workload selection), unless the kernel's QP
//!   table shows the process's RDMA queue pairs on exactly one other NIC, which wins.
//! - Path: `nic_dma` only when the process holds queue pairs on that NIC; otherwise the bytes
//!   went through sockets or shared memory (`host_copy`), and the report proves nothing about
//!   the pair's NIC path (its mismatches still count: the workload received them). A simulated
//!   device (the demo, the tests) is `nic_dma` only where a real NIC's queue pair moved its
//!   (host) memory, and its report is marked simulated, so it proves nothing of a GPU; else
//!   `simulated` where its process sets [`SIM_NIC_DMA`] (the simulated fabric standing in for
//!   the NIC's DMA), else `host_copy`.

use railguard_schema::{Bdf, DataPath, TopologySnapshot};

use super::holds::{HeldGpu, HoldError};
use crate::signals::qp::Qp;
use crate::topology::SysRoot;
use crate::topology::workloads::env_var;

/// The kernel's QP table as read, or why it could not be (shared by every message that reads
/// it within the second).
pub type QpTable = Result<Vec<Qp>, std::sync::Arc<crate::signals::qp::QpTableError>>;

/// Where a process's transfers on one CUDA device went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    pub gpu: u32,
    pub gpu_bdf: Option<Bdf>,
    pub nic: String,
    pub nic_bdf: Option<Bdf>,
    pub path: DataPath,
    pub process: String,
    /// The GPU was found through a simulated device file.
    pub simulated_device: bool,
    /// How, in words.
    pub how: String,
    /// The pod the process works for, where one is named ([`super::pods`]).
    pub pod: Option<railguard_schema::WorkloadPod>,
}

/// A result's device the process does not back with a GPU it holds: refused, and counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device {device}: {why}")]
pub struct Unbacked {
    pub device: u32,
    pub why: String,
}

/// The process's CUDA numbering of the node's GPUs (node indices, device ordinal order), and
/// how it was read; `None` where the environment cannot be read as a list. A number in either
/// variable is a position in PCI bus order (the order of `snapshot.gpus`), which is the node's
/// index only until a GPU leaves the bus.
pub fn cuda_order(env: &[u8], snapshot: &TopologySnapshot, how: &mut Vec<String>) -> Option<Vec<u32>> {
    let by_name = |d: &str| -> Option<u32> {
        match d.parse::<usize>() {
            Ok(i) => snapshot.gpus.get(i).map(|g| g.index),
            Err(_) if d.starts_with("GPU-") => {
                let mut m = snapshot.gpus.iter().filter(|g| !g.uuid.is_empty() && g.uuid.starts_with(d));
                match (m.next(), m.next()) {
                    (Some(g), None) => Some(g.index),
                    _ => None,
                }
            }
            Err(_) => None,
        }
    };
    let mut visible: Vec<u32> = match env_var(env, "NVIDIA_VISIBLE_DEVICES").map(str::trim) {
        None | Some("all") => snapshot.gpus.iter().map(|g| g.index).collect(),
        Some("" | "void" | "none") => {
            how.push("NVIDIA_VISIBLE_DEVICES gives the process no GPU".into());
            Vec::new()
        }
        Some(list) => {
            let resolved: Option<Vec<u32>> =
                list.split(',').map(str::trim).filter(|d| !d.is_empty()).map(by_name).collect();
            match resolved {
                Some(v) => {
                    how.push(format!("NVIDIA_VISIBLE_DEVICES={list}"));
                    v
                }
                None => {
                    how.push(format!("NVIDIA_VISIBLE_DEVICES={list} is not a list of this node's GPUs"));
                    return None;
                }
            }
        }
    };
    let bus_position = |g: &u32| snapshot.gpus.iter().position(|x| x.index == *g);
    visible.sort_unstable_by_key(bus_position);
    visible.dedup();
    let Some(list) = env_var(env, "CUDA_VISIBLE_DEVICES") else {
        return Some(visible);
    };
    // CUDA stops at the first entry it cannot use.
    let mut order = Vec::new();
    for d in list.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let g = match d.parse::<usize>() {
            Ok(i) => visible.get(i).copied(),
            Err(_) => by_name(d).filter(|g| visible.contains(g)),
        };
        match g {
            Some(g) if !order.contains(&g) => order.push(g),
            _ => break,
        }
    }
    how.push(format!("CUDA_VISIBLE_DEVICES={list}"));
    Some(order)
}

fn held_names(held: &[HeldGpu]) -> String {
    if held.is_empty() {
        return "no GPU device file".into();
    }
    held.iter()
        .map(|h| format!("GPU{} (/dev/nvidia{}{})", h.index, h.minor, if h.simulated { ", simulated" } else { "" }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Attributes device `device` of process `pid`, which holds `held` open. `qps` is the kernel's
/// QP table (or why it could not be read).
pub fn attribute(
    proc_: &SysRoot,
    snapshot: &TopologySnapshot,
    pid: u32,
    device: u32,
    held: &Result<Vec<HeldGpu>, HoldError>,
    qps: &QpTable,
) -> Result<Attribution, Unbacked> {
    let unbacked = |why: String| Unbacked { device, why };
    let held = held.as_ref().map_err(|e| unbacked(e.to_string()))?;
    let process = proc_.read(format!("{pid}/comm")).map(|c| c.trim().to_owned()).unwrap_or_default();
    let mut how = Vec::new();
    let env = proc_.read_bytes(format!("{pid}/environ")).map_err(|e| {
        unbacked(format!("process {pid}'s environment is unreadable ({e}): is the agent in the host's PID namespace?"))
    })?;
    let order = cuda_order(&env, snapshot, &mut how);
    let found = match &order {
        Some(o) => o.get(device as usize).copied(),
        None => None,
    };
    let gpu = match (found, held.as_slice()) {
        (Some(g), _) if held.iter().any(|h| h.index == g) => {
            how.push(format!("device {device} is GPU{g}"));
            g
        }
        (Some(g), _) => {
            return Err(unbacked(format!(
                "{}: device {device} is GPU{g}, which the process does not hold open (it holds {})",
                how.join(", "),
                held_names(held)
            )));
        }
        (None, [only]) if device == 0 && order.is_none() => {
            how.push(format!("device 0 is GPU{}, the only GPU the process holds", only.index));
            only.index
        }
        (None, _) => {
            let numbered = match &order {
                Some(o) if o.is_empty() => "the process is given no GPU".to_owned(),
                Some(o) => format!("the process numbers {} GPU(s)", o.len()),
                None => "the process's numbering is unknown".to_owned(),
            };
            return Err(unbacked(format!(
                "{}{numbered}, no device {device} (it holds {})",
                if how.is_empty() { String::new() } else { format!("{}: ", how.join(", ")) },
                held_names(held)
            )));
        }
    };
    let simulated_device = held.iter().any(|h| h.index == gpu && h.simulated);
    if let Some(h) = held.iter().find(|h| h.index == gpu) {
        how.push(format!(
            "holds /dev/nvidia{}{}",
            h.minor,
            if h.simulated { " (a simulated device file)" } else { "" }
        ));
    }
    let mut how = vec![how.join(", ")];
    let gpu_bdf = snapshot.gpus.iter().find(|x| x.index == gpu).map(|g| g.bdf);
    let predicted = snapshot.risks.iter().find(|r| r.gpu == gpu).and_then(|r| r.predicted_nic.clone());
    let mine: Vec<&Qp> = match qps {
        Ok(all) => all.iter().filter(|q| q.pid == Some(pid)).collect(),
        Err(_) => Vec::new(),
    };
    let mut devices: Vec<&str> = mine.iter().map(|q| q.device.as_str()).collect();
    devices.sort_unstable();
    devices.dedup();
    let nic = match (&predicted, devices.as_slice()) {
        (Some(p), d) if d.contains(&p.as_str()) => {
            how.push(format!("its workload NIC {p}, where the process holds {} queue pair(s)", count(&mine, p)));
            p.clone()
        }
        (_, [only]) => {
            how.push(format!(
                "the process's queue pairs are all on {only}{}",
                predicted.as_ref().map(|p| format!(" (not {p}, the NIC predicted for its GPU)")).unwrap_or_default()
            ));
            (*only).to_owned()
        }
        (Some(p), d) => {
            how.push(match (qps, d) {
                (Err(e), _) => format!("its workload NIC {p} (predicted; the QP table is unreadable: {e})"),
                (Ok(_), []) => format!("its workload NIC {p} (predicted; the process holds no RDMA queue pair)"),
                (Ok(_), d) => {
                    format!("its workload NIC {p} (predicted; the process's queue pairs are on {})", d.join(", "))
                }
            });
            p.clone()
        }
        (None, _) => {
            how.push("no NIC: none predicted for the GPU and no single NIC in the process's queue pairs".into());
            String::new()
        }
    };
    // The NIC's DMA carried the transfers only if the process holds a reliable-connected queue
    // pair ready to send (RTS) on it: any QP in any state on the device proves nothing of where
    // these bytes went (a QP left in RESET, or one in ERR).
    let ready = mine.iter().any(|q| q.device == nic && q.kind == Some(IB_QPT_RC) && q.state == IB_QPS_RTS);
    let path = if simulated_device {
        // A simulated GPU's memory is host memory. A real NIC may still move it by DMA (its RC
        // queue pair ready on that NIC): `nic_dma`, carried as a simulated device's report, so
        // it proves nothing of a GPU. Otherwise, where its process asks for it, the simulated
        // fabric stands in for the NIC's DMA (the demo's remote fault); the report says so and
        // proves nothing. Only a device the agent was told is simulated takes this.
        if !nic.is_empty() && ready {
            how.push(format!("{nic}'s DMA is real (an RC queue pair in RTS); the GPU is simulated (host memory)"));
            DataPath::NicDma
        } else if !nic.is_empty() && env_var(&env, SIM_NIC_DMA) == Some("1") {
            how.push(format!("the simulated fabric stands in for {nic}'s DMA ({SIM_NIC_DMA}=1)"));
            DataPath::Simulated
        } else {
            how.push("a simulated device: counted as a host copy".into());
            DataPath::HostCopy
        }
    } else if nic.is_empty() || !ready {
        if !nic.is_empty() && devices.contains(&nic.as_str()) {
            how.push(format!("none of its queue pairs on {nic} is an RC queue pair in RTS: counted as a host copy"));
        }
        DataPath::HostCopy
    } else {
        DataPath::NicDma
    };
    let nic_bdf = snapshot.nics.iter().find(|n| n.name == nic).map(|n| n.bdf);
    Ok(Attribution { gpu, gpu_bdf, nic, nic_bdf, path, process, simulated_device, how: how.join("; "), pod: None })
}

/// A simulated device's process sets this to 1 for the simulated fabric to stand in for its
/// NIC's DMA (`path = simulated`); ignored for a real GPU.
pub const SIM_NIC_DMA: &str = "RAILGUARD_SIM_NIC_DMA";

/// `enum ib_qp_type`: reliable connected, what NIXL's UCX uses to move KV blocks.
const IB_QPT_RC: u8 = 2;
/// `enum ib_qp_state`: ready to send.
const IB_QPS_RTS: u8 = 3;

fn count(qps: &[&Qp], device: &str) -> usize {
    qps.iter().filter(|q| q.device == device).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use railguard_schema::{Gpu, GpuRisk, Nic, RiskLevel};

    fn snapshot() -> TopologySnapshot {
        TopologySnapshot {
            host: railguard_schema::HostFacts {
                virtualized: railguard_schema::Tristate::No,
                hypervisor: String::new(),
                viommu: railguard_schema::Tristate::Unknown,
                gpudirect: "none".into(),
                kernel_iommu_flags: String::new(),
                driver_version: String::new(),
            },
            gpus: (0..4)
                .map(|i| Gpu {
                    index: i,
                    bdf: format!("0000:{:02x}:00.0", 0x10 + i).parse().unwrap(),
                    numa_node: 0,
                    name: "H100".into(),
                    uuid: format!("GPU-{i}{i}{i}{i}"),
                })
                .collect(),
            nics: (0..4)
                .map(|i| Nic {
                    name: format!("mlx5_{i}"),
                    bdf: format!("0000:{:02x}:00.0", 0x20 + i).parse().unwrap(),
                    numa_node: 0,
                    ports: vec![],
                    netdevs: vec![],
                })
                .collect(),
            paths: vec![],
            risks: (0..4)
                .map(|i| GpuRisk {
                    gpu: i,
                    level: RiskLevel::High,
                    reasons: vec![],
                    affine_nic: None,
                    predicted_nic: Some(format!("mlx5_{i}")),
                    pinned: false,
                    safe_nics: vec![],
                    other_workload_nics: vec![],
                })
                .collect(),
            warnings: vec![],
            gone: vec![],
        }
    }

    fn proc_with(env: &[&str]) -> (tempfile::TempDir, SysRoot) {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("77")).unwrap();
        std::fs::write(d.path().join("77/environ"), env.join("\0")).unwrap();
        std::fs::write(d.path().join("77/comm"), "vllm\n").unwrap();
        let root = SysRoot::new(d.path());
        (d, root)
    }

    fn qp(device: &str, pid: u32) -> Qp {
        Qp { device: device.into(), port: Some(1), qpn: 9, state: 3, kind: Some(2), pid: Some(pid), kern_name: None }
    }

    fn holding(gpus: &[u32]) -> Result<Vec<HeldGpu>, HoldError> {
        Ok(gpus.iter().map(|g| HeldGpu { index: *g, minor: *g, simulated: false }).collect())
    }

    #[test]
    fn a_simulated_device_is_marked_so_and_the_simulated_fabric_stands_in_only_when_asked() {
        let sim = Ok(vec![HeldGpu { index: 1, minor: 1, simulated: true }]);
        // A real NIC's ready RC queue pair moved the simulated GPU's (host) memory: its DMA,
        // on a report marked as a simulated device's (the collector counts it as no GPU's proof).
        let (_d, p) = proc_with(&["CUDA_VISIBLE_DEVICES=1"]);
        let a = attribute(&p, &snapshot(), 77, 0, &sim, &Ok(vec![qp("mlx5_1", 77)])).unwrap();
        assert_eq!((a.path, a.simulated_device), (DataPath::NicDma, true), "{}", a.how);
        assert!(a.how.contains("the GPU is simulated (host memory)"), "{}", a.how);
        // A queue pair not ready to send moved nothing: a host copy.
        let reset = Qp { state: 0, ..qp("mlx5_1", 77) };
        let a = attribute(&p, &snapshot(), 77, 0, &sim, &Ok(vec![reset])).unwrap();
        assert_eq!(a.path, DataPath::HostCopy, "{}", a.how);
        let (_d, p) = proc_with(&["CUDA_VISIBLE_DEVICES=1", "RAILGUARD_SIM_NIC_DMA=1"]);
        let a = attribute(&p, &snapshot(), 77, 0, &sim, &Ok(vec![])).unwrap();
        assert_eq!((a.nic.as_str(), a.path), ("mlx5_1", DataPath::Simulated));
        assert!(a.how.contains("the simulated fabric stands in for mlx5_1's DMA"), "{}", a.how);
        // A real GPU's process asking for it gets nothing.
        let a = attribute(&p, &snapshot(), 77, 0, &holding(&[1]), &Ok(vec![])).unwrap();
        assert_eq!(a.path, DataPath::HostCopy);
    }

    #[test]
    fn device_through_cuda_visible_devices_and_nic_through_its_queue_pairs() {
        let (_d, p) = proc_with(&["CUDA_VISIBLE_DEVICES=2,3"]);
        let held = holding(&[2, 3]);
        let a =
            attribute(&p, &snapshot(), 77, 1, &held, &Ok(vec![qp("mlx5_3", 77), qp("mlx5_3", 77), qp("mlx5_0", 5)]))
                .unwrap();
        assert_eq!((a.gpu, a.nic.as_str(), a.path, a.process.as_str()), (3, "mlx5_3", DataPath::NicDma, "vllm"));
        assert_eq!(a.gpu_bdf.unwrap().to_string(), "0000:13:00.0");
        assert_eq!(a.nic_bdf.unwrap().to_string(), "0000:23:00.0");
        assert!(a.how.contains("CUDA_VISIBLE_DEVICES=2,3, device 1 is GPU3, holds /dev/nvidia3"), "{}", a.how);
        assert!(a.how.contains("2 queue pair(s)"), "{}", a.how);

        // Queue pairs on one other NIC: that is where the bytes went.
        let a = attribute(&p, &snapshot(), 77, 1, &held, &Ok(vec![qp("mlx5_1", 77)])).unwrap();
        assert_eq!((a.nic.as_str(), a.path), ("mlx5_1", DataPath::NicDma));
        assert!(a.how.contains("not mlx5_3"), "{}", a.how);

        // Queue pairs on the NIC, but none an RC QP ready to send: no proof the NIC carried them.
        let idle = Qp { state: 0, ..qp("mlx5_3", 77) };
        let ud = Qp { kind: Some(4), ..qp("mlx5_3", 77) };
        let errored = Qp { state: 6, ..qp("mlx5_3", 77) };
        for q in [idle, ud, errored] {
            let a = attribute(&p, &snapshot(), 77, 1, &held, &Ok(vec![q.clone()])).unwrap();
            assert_eq!((a.nic.as_str(), a.path), ("mlx5_3", DataPath::HostCopy), "{q:?}");
            assert!(a.how.contains("none of its queue pairs on mlx5_3 is an RC queue pair in RTS"), "{}", a.how);
        }

        // No queue pair: the predicted NIC, but a host copy.
        let a = attribute(&p, &snapshot(), 77, 0, &held, &Ok(vec![])).unwrap();
        assert_eq!((a.gpu, a.nic.as_str(), a.path), (2, "mlx5_2", DataPath::HostCopy));
        let unreadable = Err(std::sync::Arc::new(crate::signals::qp::QpTableError::Kernel(-13)));
        let a = attribute(&p, &snapshot(), 77, 0, &held, &unreadable).unwrap();
        assert_eq!(a.path, DataPath::HostCopy);
        assert!(a.how.contains("unreadable: rdma netlink: the kernel answered error -13"), "{}", a.how);
    }

    #[test]
    fn cuda_numbers_positions_on_the_bus_not_the_nodes_indices() {
        // GPU0 has left the bus: the node's GPUs are 1, 2, 3 (kept by its roll) at bus positions
        // 0, 1, 2, and a new card at the lowest address took index 4. CUDA's device 0 is the
        // first on the bus.
        let mut t = snapshot();
        t.gpus.remove(0);
        t.gpus.insert(0, Gpu { index: 4, bdf: "0000:0f:00.0".parse().unwrap(), ..t.gpus[0].clone() });
        let mut how = Vec::new();
        assert_eq!(cuda_order(b"CUDA_VISIBLE_DEVICES=0,2", &t, &mut how), Some(vec![4, 2]));
        assert_eq!(cuda_order(b"", &t, &mut how), Some(vec![4, 1, 2, 3]));
        assert_eq!(cuda_order(b"NVIDIA_VISIBLE_DEVICES=1,0", &t, &mut how), Some(vec![4, 1]));
        assert_eq!(cuda_order(b"CUDA_VISIBLE_DEVICES=3", &t, &mut how), Some(vec![3]));
        assert_eq!(cuda_order(b"CUDA_VISIBLE_DEVICES=4", &t, &mut how), Some(vec![]), "index 4 is no ordinal");
    }

    #[test]
    fn a_claim_on_a_gpu_the_process_does_not_hold_is_refused() {
        // The environment says device 0 is GPU0; the process holds GPU2 only.
        let (_d, p) = proc_with(&["CUDA_VISIBLE_DEVICES=0"]);
        let e = attribute(&p, &snapshot(), 77, 0, &holding(&[2]), &Ok(vec![])).unwrap_err();
        assert_eq!(e.device, 0);
        assert!(e.why.contains("device 0 is GPU0, which the process does not hold open (it holds GPU2"), "{e}");
        // Holding nothing backs nothing, whatever the environment says.
        let e = attribute(&p, &snapshot(), 77, 0, &holding(&[]), &Ok(vec![])).unwrap_err();
        assert!(e.why.contains("it holds no GPU device file"), "{e}");
        // Unreadable descriptors back nothing either.
        let unreadable =
            Err(HoldError::Descriptors { pid: 77, source: std::io::Error::from_raw_os_error(libc::EACCES) });
        let e = attribute(&p, &snapshot(), 77, 0, &unreadable, &Ok(vec![])).unwrap_err();
        assert!(e.why.contains("open files of process 77 are unreadable"), "{e}");
        // A device beyond the process's numbering.
        let e = attribute(&p, &snapshot(), 77, 1, &holding(&[0]), &Ok(vec![])).unwrap_err();
        assert!(e.why.contains("numbers 1 GPU(s), no device 1"), "{e}");
    }

    #[test]
    fn in_a_pod_device_0_is_the_gpu_the_device_plugin_gave_it() {
        // The device plugin gave the pod GPU1 (by UUID): CUDA's device 0 inside is node GPU1.
        let (_d, p) = proc_with(&["NVIDIA_VISIBLE_DEVICES=GPU-1111"]);
        let a = attribute(&p, &snapshot(), 77, 0, &holding(&[1]), &Ok(vec![])).unwrap();
        assert_eq!(a.gpu, 1, "{}", a.how);
        assert!(a.how.contains("NVIDIA_VISIBLE_DEVICES=GPU-1111, device 0 is GPU1"), "{}", a.how);
        // Two GPUs by index, reordered by CUDA_VISIBLE_DEVICES inside the pod.
        let (_d, p) = proc_with(&["NVIDIA_VISIBLE_DEVICES=3,1", "CUDA_VISIBLE_DEVICES=1,0"]);
        let held = holding(&[1, 3]);
        assert_eq!(attribute(&p, &snapshot(), 77, 0, &held, &Ok(vec![])).unwrap().gpu, 3);
        assert_eq!(attribute(&p, &snapshot(), 77, 1, &held, &Ok(vec![])).unwrap().gpu, 1);
        // The volume-mounts strategy lists no GPUs in the variable: the one GPU held is device 0.
        let (_d, p) = proc_with(&["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"]);
        let a = attribute(&p, &snapshot(), 77, 0, &holding(&[2]), &Ok(vec![])).unwrap();
        assert_eq!(a.gpu, 2);
        assert!(a.how.contains("the only GPU the process holds"), "{}", a.how);
        assert!(attribute(&p, &snapshot(), 77, 0, &holding(&[1, 2]), &Ok(vec![])).is_err());
    }

    #[test]
    fn uuids_prefixes_unset_and_unknown_devices() {
        let (_d, p) = proc_with(&["CUDA_VISIBLE_DEVICES=GPU-1111"]);
        let all = holding(&[0, 1, 2, 3]);
        assert_eq!(attribute(&p, &snapshot(), 77, 0, &all, &Ok(vec![])).unwrap().gpu, 1);
        assert!(attribute(&p, &snapshot(), 77, 1, &all, &Ok(vec![])).is_err());
        // A unique UUID prefix, as CUDA accepts; a list stops at its first unusable entry.
        let (_d, p) = proc_with(&["CUDA_VISIBLE_DEVICES=GPU-22,7,0"]);
        assert_eq!(attribute(&p, &snapshot(), 77, 0, &all, &Ok(vec![])).unwrap().gpu, 2);
        assert!(attribute(&p, &snapshot(), 77, 1, &all, &Ok(vec![])).is_err());
        let (_d, p) = proc_with(&["PATH=/bin"]);
        assert_eq!(attribute(&p, &snapshot(), 77, 2, &all, &Ok(vec![])).unwrap().gpu, 2);
        assert!(attribute(&p, &snapshot(), 77, 9, &all, &Ok(vec![])).unwrap_err().why.contains("no device 9"));
        let e = attribute(&p, &snapshot(), 78, 0, &all, &Ok(vec![])).unwrap_err();
        assert!(e.why.contains("environment is unreadable"), "{e}");
    }
}
