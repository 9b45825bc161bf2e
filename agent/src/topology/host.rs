//! Host facts: virtualisation, vIOMMU, kernel IOMMU flags, GPUDirect path (docs/how-railguard-decides.md §4).

use railguard_schema::{Bdf, HostFacts, Tristate};

use super::sysroot::SysRoot;

/// DMI prefixes of hypervisors and clouds, with the name reported.
const HYPERVISORS: &[(&str, &str)] = &[
    ("KVM", "kvm"),
    ("QEMU", "qemu"),
    ("OpenStack", "openstack"),
    ("KubeVirt", "kubevirt"),
    ("Amazon EC2", "amazon-ec2"),
    ("Google", "google-compute-engine"),
    ("Microsoft", "hyper-v"),
    ("VMware", "vmware"),
    ("Xen", "xen"),
    ("innotek", "virtualbox"),
];

#[derive(Debug, Clone)]
pub struct HostDetail {
    pub facts: HostFacts,
    /// IOMMU group type of a device (`DMA`, `DMA-FQ`, `identity`, ...), by PCI address.
    pub iommu_group_type: std::collections::BTreeMap<Bdf, String>,
    /// The kernel command line turns translation off (`iommu=pt`, `intel_iommu=off`, ...).
    pub iommu_passthrough_cmdline: bool,
}

/// The GPUDirect registration path the node shows evidence of (docs/how-railguard-decides.md §4):
/// `nvidia-peermem` where that module is loaded; `dma-buf` where the NVIDIA driver is the open
/// kernel module (dma-buf export of GPU memory needs it) on a kernel with RDMA dma-buf support
/// (5.12+); `none` where the driver is loaded with neither, or no GPU; `unknown` where the tree
/// cannot say (no driver information).
pub fn gpudirect(sys: &SysRoot, proc_: &SysRoot, has_gpus: bool) -> &'static str {
    let peermem =
        ["module/nvidia_peermem/version", "kernel/mm/memory_peers/nv_mem/version", "module/nv_peer_mem/version"]
            .iter()
            .any(|p| sys.exists(p));
    if peermem {
        return "nvidia-peermem";
    }
    if !has_gpus {
        return "none";
    }
    // The proprietary module taints the kernel with `P`; the open one does not.
    let open_module = match sys.read("module/nvidia/taint") {
        Ok(t) => !t.contains('P'),
        Err(_) if sys.exists("module") && !sys.exists("module/nvidia") => return "none", // no driver loaded
        Err(_) => return "unknown",
    };
    if !open_module {
        return "none";
    }
    match proc_.read("sys/kernel/osrelease").ok().as_deref().and_then(kernel_version) {
        Some(v) if v >= (5, 12) => "dma-buf",
        Some(_) => "none",
        None => "unknown",
    }
}

/// `6.1.0-57-amd64` → (6, 1).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.trim().split(['.', '-']);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

pub fn detect(sys: &SysRoot, proc_: &SysRoot, has_gpus: bool, warnings: &mut Vec<String>) -> HostDetail {
    let cpu_flag = match proc_.read("cpuinfo") {
        Ok(c) => Some(c.lines().any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "hypervisor"))),
        Err(e) => {
            warnings.push(format!("cpuinfo unreadable: {e}"));
            None
        }
    };
    let dmi: Vec<String> = ["sys_vendor", "product_name", "board_vendor", "bios_vendor"]
        .iter()
        .filter_map(|f| sys.read(format!("class/dmi/id/{f}")).ok())
        .collect();
    let hypervisor = dmi
        .iter()
        .find_map(|v| HYPERVISORS.iter().find(|(prefix, _)| v.starts_with(prefix)).map(|(_, name)| (*name).to_owned()));
    let virtualized = match (cpu_flag, &hypervisor) {
        (Some(true), _) | (_, Some(_)) => Tristate::Yes,
        (Some(false), None) => Tristate::No,
        (None, None) => Tristate::Unknown,
    };
    let hypervisor = match (&virtualized, hypervisor) {
        (Tristate::Yes, None) => "unknown".to_owned(),
        (_, h) => h.unwrap_or_default(),
    };

    let iommus = sys.list("class/iommu").unwrap_or_default();
    let groups = sys.list("kernel/iommu_groups").unwrap_or_default();
    let mut iommu_group_type = std::collections::BTreeMap::new();
    for g in &groups {
        let ty = sys.read(format!("kernel/iommu_groups/{g}/type")).unwrap_or_else(|_| "unknown".into());
        for dev in sys.list(format!("kernel/iommu_groups/{g}/devices")).unwrap_or_default() {
            if let Ok(b) = dev.parse::<Bdf>() {
                iommu_group_type.insert(b, ty.clone());
            }
        }
    }
    let cmdline = proc_.read("cmdline").unwrap_or_default();
    let flags: Vec<&str> = cmdline
        .split_whitespace()
        .filter(|t| {
            ["intel_iommu=", "amd_iommu=", "iommu=", "iommu.passthrough=", "iommu.strict="]
                .iter()
                .any(|p| t.starts_with(p))
        })
        .collect();
    let iommu_passthrough_cmdline = flags
        .iter()
        .any(|t| matches!(*t, "iommu=pt" | "iommu=off" | "intel_iommu=off" | "amd_iommu=off" | "iommu.passthrough=1"));
    // A guest with no IOMMU device has no vIOMMU; one with dmar/ivhd/virtio-iommu entries has one.
    let viommu = match (&virtualized, iommus.is_empty()) {
        (Tristate::Yes, true) => Tristate::No,
        (Tristate::Yes, false) => Tristate::Yes,
        _ => Tristate::No, // not a guest: no *virtual* IOMMU (the host's own IOMMU is reported per group)
    };
    let gpudirect = gpudirect(sys, proc_, has_gpus);
    HostDetail {
        facts: HostFacts {
            virtualized,
            hypervisor,
            viommu,
            gpudirect: gpudirect.to_owned(),
            kernel_iommu_flags: flags.join(" "),
            driver_version: sys.read("module/nvidia/version").map(|v| v.trim().to_owned()).unwrap_or_default(),
        },
        iommu_group_type,
        iommu_passthrough_cmdline,
    }
}
