//! Which GPU and NIC a reporting process's transfers used, and whether its NIC moved them.
//!
//! - GPU: the result's CUDA device ordinal, through the process's `CUDA_VISIBLE_DEVICES`
//!   (indices or `GPU-…` UUIDs); unset, the ordinal is taken as the node's GPU index (as with
//!   `CUDA_DEVICE_ORDER=PCI_BUS_ID`, what serving stacks set), and the attribution says so.
//! - NIC: the NIC the agent predicts for that GPU under the process's own selection
//!   (`UCX_NET_DEVICES`, …: the topology's per-GPU workload selection), unless the kernel's QP
//!   table shows the process's RDMA queue pairs on exactly one other NIC, which wins.
//! - Path: `nic_dma` only when the process holds queue pairs on that NIC; otherwise the bytes
//!   went through sockets or shared memory (`host_copy`), and the report proves nothing about
//!   the pair's NIC path (its mismatches still count: the workload received them).

use railguard_schema::{Bdf, DataPath, TopologySnapshot};

use crate::signals::qp::Qp;
use crate::topology::SysRoot;
use crate::topology::workloads::env_var;

/// Where a process's transfers on one CUDA device went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    pub gpu: Option<u32>,
    pub gpu_bdf: Option<Bdf>,
    pub nic: String,
    pub nic_bdf: Option<Bdf>,
    pub path: DataPath,
    pub process: String,
    /// How, in words.
    pub how: String,
}

/// Attributes device `device` of process `pid`. `qps` is the kernel's QP table (or why it
/// could not be read).
pub fn attribute(
    proc_: &SysRoot,
    snapshot: &TopologySnapshot,
    pid: u32,
    device: u32,
    qps: &Result<Vec<Qp>, String>,
) -> Attribution {
    let process = proc_.read(format!("{pid}/comm")).map(|c| c.trim().to_owned()).unwrap_or_default();
    let mut how = Vec::new();
    let gpu = match proc_.read_bytes(format!("{pid}/environ")) {
        Err(e) => {
            how.push(format!(
                "process {pid}'s environment is unreadable ({e}): is the agent in the host's PID namespace?"
            ));
            None
        }
        Ok(env) => match env_var(&env, "CUDA_VISIBLE_DEVICES") {
            None => {
                let g = snapshot.gpus.iter().find(|g| g.index == device).map(|g| g.index);
                how.push(match g {
                    Some(g) => format!("CUDA_VISIBLE_DEVICES unset: device {device} taken as GPU{g}"),
                    None => format!("CUDA_VISIBLE_DEVICES unset and no GPU{device} on this node"),
                });
                g
            }
            Some(list) => {
                let entry = list.split(',').map(str::trim).filter(|d| !d.is_empty()).nth(device as usize);
                let g = entry.and_then(|d| match d.parse::<u32>() {
                    Ok(i) => snapshot.gpus.iter().find(|g| g.index == i).map(|g| g.index),
                    Err(_) => snapshot.gpus.iter().find(|g| !g.uuid.is_empty() && g.uuid == d).map(|g| g.index),
                });
                how.push(match (entry, g) {
                    (Some(d), Some(g)) => format!("CUDA_VISIBLE_DEVICES={list}: device {device} is {d} → GPU{g}"),
                    (Some(d), None) => {
                        format!("CUDA_VISIBLE_DEVICES={list}: device {device} is {d}, not a GPU of this node")
                    }
                    (None, _) => format!("CUDA_VISIBLE_DEVICES={list} has no device {device}"),
                });
                g
            }
        },
    };
    let gpu_bdf = gpu.and_then(|g| snapshot.gpus.iter().find(|x| x.index == g)).map(|g| g.bdf);
    let predicted = gpu.and_then(|g| snapshot.risks.iter().find(|r| r.gpu == g)).and_then(|r| r.predicted_nic.clone());
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
    let path = if !nic.is_empty() && devices.contains(&nic.as_str()) { DataPath::NicDma } else { DataPath::HostCopy };
    let nic_bdf = snapshot.nics.iter().find(|n| n.name == nic).map(|n| n.bdf);
    Attribution { gpu, gpu_bdf, nic, nic_bdf, path, process, how: how.join("; ") }
}

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
                })
                .collect(),
            warnings: vec![],
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

    #[test]
    fn device_through_cuda_visible_devices_and_nic_through_its_queue_pairs() {
        let (_d, p) = proc_with(&["CUDA_VISIBLE_DEVICES=2,3"]);
        let a = attribute(&p, &snapshot(), 77, 1, &Ok(vec![qp("mlx5_3", 77), qp("mlx5_3", 77), qp("mlx5_0", 5)]));
        assert_eq!((a.gpu, a.nic.as_str(), a.path, a.process.as_str()), (Some(3), "mlx5_3", DataPath::NicDma, "vllm"));
        assert_eq!(a.gpu_bdf.unwrap().to_string(), "0000:13:00.0");
        assert_eq!(a.nic_bdf.unwrap().to_string(), "0000:23:00.0");
        assert!(a.how.contains("device 1 is 3 → GPU3") && a.how.contains("2 queue pair(s)"), "{}", a.how);

        // Queue pairs on one other NIC: that is where the bytes went.
        let a = attribute(&p, &snapshot(), 77, 1, &Ok(vec![qp("mlx5_1", 77)]));
        assert_eq!((a.nic.as_str(), a.path), ("mlx5_1", DataPath::NicDma));
        assert!(a.how.contains("not mlx5_3"), "{}", a.how);

        // No queue pair: the predicted NIC, but a host copy.
        let a = attribute(&p, &snapshot(), 77, 0, &Ok(vec![]));
        assert_eq!((a.gpu, a.nic.as_str(), a.path), (Some(2), "mlx5_2", DataPath::HostCopy));
        let a = attribute(&p, &snapshot(), 77, 0, &Err("no rdma netlink".into()));
        assert_eq!(a.path, DataPath::HostCopy);
        assert!(a.how.contains("unreadable: no rdma netlink"), "{}", a.how);
    }

    #[test]
    fn uuids_unset_and_unknown_devices() {
        let (_d, p) = proc_with(&["CUDA_VISIBLE_DEVICES=GPU-1111"]);
        assert_eq!(attribute(&p, &snapshot(), 77, 0, &Ok(vec![])).gpu, Some(1));
        let a = attribute(&p, &snapshot(), 77, 1, &Ok(vec![]));
        assert_eq!((a.gpu, a.nic.as_str()), (None, ""));
        assert!(a.how.contains("has no device 1"), "{}", a.how);
        let (_d, p) = proc_with(&["PATH=/bin"]);
        assert_eq!(attribute(&p, &snapshot(), 77, 2, &Ok(vec![])).gpu, Some(2));
        assert!(attribute(&p, &snapshot(), 77, 9, &Ok(vec![])).how.contains("no GPU9"));
        let a = attribute(&p, &snapshot(), 78, 0, &Ok(vec![]));
        assert_eq!(a.gpu, None);
        assert!(a.how.contains("unreadable"), "{}", a.how);
    }
}
