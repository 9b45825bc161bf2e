//! Fixture trees: a compact spec of a machine → a /sys and /proc tree on disk, laid out as the
//! kernel lays them out (device directories under `devices/pciDDDD:BB/...`, relative links from
//! `bus/pci/devices` and `class/infiniband`). Used by tests, benchmarks and the simulated fleet
//! of the demo, which stands in for GPU machines this project cannot run on.

use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::config_space::{ACS_CR, ACS_RR, ACS_SV, ACS_UF};

/// A machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FixtureSpec {
    /// DMI sys_vendor of a hypervisor (`QEMU`, `KVM`, ...) and the cpuinfo `hypervisor` flag.
    #[serde(default)]
    pub hypervisor: Option<String>,
    /// The guest has a vIOMMU / the host an IOMMU device (`class/iommu/dmar0`).
    #[serde(default)]
    pub iommu_device: bool,
    /// IOMMU group type given to every endpoint (`DMA`, `DMA-FQ`, `identity`); none: no groups.
    #[serde(default)]
    pub iommu_group_type: Option<String>,
    #[serde(default)]
    pub cmdline: String,
    #[serde(default)]
    pub peermem: bool,
    /// The NVIDIA kernel module's kind, as its taint flags show it: `open` (no `P`) or
    /// `proprietary` (`P`); None: no taint file (the tree cannot say).
    #[serde(default)]
    pub nvidia_module: Option<String>,
    /// `/proc/sys/kernel/osrelease`; None: not written.
    #[serde(default)]
    pub kernel_release: Option<String>,
    /// Full config space readable (as root); false: 64 bytes only.
    #[serde(default)]
    pub config_readable: bool,
    /// ACS P2P redirect (RR+CR) set on switch downstream ports.
    #[serde(default)]
    pub acs_redirect: bool,
    /// ATS enabled on RDMA NICs.
    #[serde(default)]
    pub nic_ats: bool,
    /// The NVIDIA driver version the tree's module reports; None: 560.35.03.
    #[serde(default)]
    pub driver_version: Option<String>,
    pub roots: Vec<RootSpec>,
}

/// A PCIe host bridge (`pciDDDD:BB`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RootSpec {
    #[serde(default)]
    pub domain: u16,
    pub bus: u8,
    pub numa: i32,
    /// Each slot behind its own root port.
    #[serde(default)]
    pub ports: Vec<Slot>,
    /// Endpoints directly on the root bus (flat VMs).
    #[serde(default)]
    pub direct: Vec<Slot>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Slot {
    /// A PCIe switch: upstream port, one downstream port per child.
    Switch(Vec<Slot>),
    /// An NVIDIA H200-like GPU; `audio` adds its HDMI audio function (.1).
    Gpu {
        #[serde(default)]
        audio: bool,
    },
    /// An RDMA NIC: one PCI function per name (two names: a dual-function card), `ports`
    /// InfiniBand ports per function.
    Nic { names: Vec<String>, ports: u32 },
    /// A NIC without RDMA (virtio-net).
    EthNic,
}

struct Writer<'a> {
    sys: &'a Path,
    spec: &'a FixtureSpec,
    next_bus: u16,
    domain: u16,
    numa: i32,
    group: u32,
}

fn w(path: &Path, content: impl AsRef<[u8]>) -> io::Result<()> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::write(path, content)
}

/// `from` → `to`, both inside the tree, as a relative link like the kernel's.
fn rel_link(from: &Path, to: &Path) -> io::Result<()> {
    let from_dir = from.parent().unwrap_or(Path::new(""));
    let common = from_dir.components().zip(to.components()).take_while(|(a, b)| a == b).count();
    let mut rel = PathBuf::new();
    for _ in from_dir.components().skip(common) {
        rel.push("..");
    }
    for c in to.components().skip(common) {
        rel.push(c);
    }
    std::fs::create_dir_all(from_dir)?;
    symlink(rel, from)
}

impl Writer<'_> {
    fn alloc_bus(&mut self) -> u8 {
        let b = self.next_bus;
        self.next_bus += 1;
        b as u8
    }

    fn config(&self, acs: Option<u16>, ats: Option<bool>) -> Vec<u8> {
        if !self.spec.config_readable {
            return vec![0u8; 64];
        }
        super::config_space::build(acs, ats)
    }

    /// Writes one PCI function under `parent` (a directory relative to the tree root).
    #[allow(clippy::too_many_arguments)] // one argument per sysfs attribute written
    fn device(
        &mut self,
        parent: &Path,
        bus: u8,
        dev: u8,
        func: u8,
        vendor: u16,
        device: u16,
        class: u32,
        config: Vec<u8>,
    ) -> io::Result<PathBuf> {
        let bdf = format!("{:04x}:{bus:02x}:{dev:02x}.{func}", self.domain);
        let dir = parent.join(&bdf);
        let abs = self.sys.join(&dir);
        w(&abs.join("vendor"), format!("0x{vendor:04x}\n"))?;
        w(&abs.join("device"), format!("0x{device:04x}\n"))?;
        w(&abs.join("class"), format!("0x{class:06x}\n"))?;
        w(&abs.join("numa_node"), format!("{}\n", self.numa))?;
        w(&abs.join("config"), config)?;
        rel_link(&self.sys.join("bus/pci/devices").join(&bdf), &abs)?;
        if let Some(ty) = &self.spec.iommu_group_type
            && class >> 8 != 0x0604
        {
            {
                let g = self.sys.join(format!("kernel/iommu_groups/{}", self.group));
                w(&g.join("type"), format!("{ty}\n"))?;
                rel_link(&g.join("devices").join(&bdf), &abs)?;
                rel_link(&abs.join("iommu_group"), &g)?;
                self.group += 1;
            }
        }
        Ok(dir)
    }

    fn bridge(&mut self, parent: &Path, bus: u8, dev: u8, downstream: bool) -> io::Result<PathBuf> {
        let acs = if downstream && self.spec.acs_redirect { ACS_SV | ACS_RR | ACS_CR | ACS_UF } else { ACS_SV };
        let config = self.config(Some(acs), None);
        self.device(parent, bus, dev, 0, 0x1000, 0xc030, 0x060400, config)
    }

    /// Places `slot` on bus `bus` as device `dev` under `parent`.
    fn slot(&mut self, parent: &Path, bus: u8, dev: u8, slot: &Slot) -> io::Result<()> {
        match slot {
            Slot::Switch(children) => {
                let up = self.bridge(parent, bus, dev, false)?;
                let inner = self.alloc_bus();
                for (i, child) in children.iter().enumerate() {
                    let down = self.bridge(&up, inner, i as u8, true)?;
                    let sec = self.alloc_bus();
                    self.slot(&down, sec, 0, child)?;
                }
            }
            Slot::Gpu { audio } => {
                let config = self.config(None, None);
                self.device(parent, bus, dev, 0, 0x10de, 0x2335, 0x030200, config)?;
                if *audio {
                    let config = self.config(None, None);
                    self.device(parent, bus, dev, 1, 0x10de, 0x22ba, 0x040300, config)?;
                }
            }
            Slot::Nic { names, ports } => {
                for (f, name) in names.iter().enumerate() {
                    let config = self.config(None, Some(self.spec.nic_ats));
                    let dir = self.device(parent, bus, dev, f as u8, 0x15b3, 0x1021, 0x020700, config)?;
                    let abs = self.sys.join(&dir);
                    let ib = abs.join("infiniband").join(name);
                    for p in 1..=*ports {
                        let port = ib.join(format!("ports/{p}"));
                        w(&port.join("state"), "4: ACTIVE\n")?;
                        w(&port.join("link_layer"), "InfiniBand\n")?;
                        w(&port.join("rate"), "400 Gb/sec (4X NDR)\n")?;
                        for c in [
                            "req_cqe_error",
                            "resp_cqe_error",
                            "req_remote_access_errors",
                            "resp_remote_access_errors",
                            "local_ack_timeout_err",
                        ] {
                            w(&port.join("hw_counters").join(c), "0\n")?;
                        }
                    }
                    rel_link(&ib.join("device"), &abs)?;
                    rel_link(&self.sys.join("class/infiniband").join(name), &ib)?;
                    let ifname =
                        format!("ib{}", name.trim_start_matches(|c: char| !c.is_ascii_digit()).replace('_', ""));
                    std::fs::create_dir_all(abs.join("net").join(ifname))?;
                }
            }
            Slot::EthNic => {
                let config = self.config(None, None);
                let dir = self.device(parent, bus, dev, 0, 0x1af4, 0x1041, 0x020000, config)?;
                std::fs::create_dir_all(self.sys.join(dir).join("net/eth0"))?;
            }
        }
        Ok(())
    }
}

impl FixtureSpec {
    /// Writes the tree: `<out>/sys` and `<out>/proc`.
    pub fn write(&self, out: &Path) -> io::Result<()> {
        let sys = out.join("sys");
        let proc_ = out.join("proc");
        std::fs::create_dir_all(sys.join("bus/pci/devices"))?;
        std::fs::create_dir_all(sys.join("class/infiniband"))?;
        std::fs::create_dir_all(sys.join("class/iommu"))?;
        std::fs::create_dir_all(sys.join("kernel/iommu_groups"))?;
        let flags =
            if self.hypervisor.is_some() { "fpu vme de pse hypervisor lahf_lm" } else { "fpu vme de pse lahf_lm" };
        let mut cpuinfo = String::new();
        for cpu in 0..2 {
            cpuinfo.push_str(&format!("processor\t: {cpu}\nvendor_id\t: GenuineIntel\nflags\t\t: {flags}\n\n"));
        }
        w(&proc_.join("cpuinfo"), cpuinfo)?;
        w(&proc_.join("cmdline"), format!("BOOT_IMAGE=/vmlinuz root=/dev/vda1 {}\n", self.cmdline))?;
        let (vendor, product) = match &self.hypervisor {
            Some(h) => (h.clone(), "Standard PC (Q35 + ICH9, 2009)".to_owned()),
            None => ("NVIDIA".to_owned(), "DGX H100".to_owned()),
        };
        w(&sys.join("class/dmi/id/sys_vendor"), format!("{vendor}\n"))?;
        w(&sys.join("class/dmi/id/product_name"), format!("{product}\n"))?;
        if self.iommu_device {
            std::fs::create_dir_all(sys.join("class/iommu/dmar0"))?;
        }
        if self.roots.iter().any(|r| has_gpu(&r.ports) || has_gpu(&r.direct)) {
            w(
                &sys.join("module/nvidia/version"),
                format!("{}\n", self.driver_version.as_deref().unwrap_or("560.35.03")),
            )?;
        }
        if self.peermem {
            w(
                &sys.join("module/nvidia_peermem/version"),
                format!("{}\n", self.driver_version.as_deref().unwrap_or("560.35.03")),
            )?;
        }
        match self.nvidia_module.as_deref() {
            Some("open") => w(&sys.join("module/nvidia/taint"), "O\n")?,
            Some(_) => w(&sys.join("module/nvidia/taint"), "PO\n")?,
            None => {}
        }
        if let Some(r) = &self.kernel_release {
            w(&proc_.join("sys/kernel/osrelease"), format!("{r}\n"))?;
        }
        let mut group = 0;
        for root in &self.roots {
            let root_dir = PathBuf::from("devices").join(format!("pci{:04x}:{:02x}", root.domain, root.bus));
            std::fs::create_dir_all(sys.join(&root_dir))?;
            let mut wr = Writer {
                sys: &sys,
                spec: self,
                next_bus: u16::from(root.bus) + 1,
                domain: root.domain,
                numa: root.numa,
                group,
            };
            for (i, slot) in root.direct.iter().enumerate() {
                wr.slot(&root_dir, root.bus, (i + 0x10) as u8, slot)?;
            }
            for (i, slot) in root.ports.iter().enumerate() {
                let port = wr.bridge(&root_dir, root.bus, (i + 1) as u8, false)?;
                let sec = wr.alloc_bus();
                wr.slot(&port, sec, 0, slot)?;
            }
            group = wr.group;
        }
        self.write_gpu_devices(out, &sys, &proc_)
    }

    /// The NVIDIA driver's view of the fixture's GPUs: `proc/driver/nvidia/gpus/<bdf>/information`
    /// with each GPU's device minor (its index, as on most hosts), and `dev/nvidiaN`, simulated
    /// device files (regular files) a test workload holds open to stand for holding the GPU
    /// (`run --simulated-gpu-devices DIR/dev`).
    fn write_gpu_devices(&self, out: &Path, sys: &Path, proc_: &Path) -> io::Result<()> {
        let mut warnings = Vec::new();
        let gpus = super::pci::enumerate(&super::SysRoot::new(sys), &mut warnings);
        for (minor, d) in gpus.iter().filter(|d| d.is_nvidia_gpu()).enumerate() {
            w(
                &proc_.join(format!("driver/nvidia/gpus/{}/information", d.bdf)),
                format!(
                    "Model: \t\t NVIDIA H200 (fixture)\nBus Type: \t PCIe\nBus Location: \t {}\nDevice Minor: \t {minor}\nGPU UUID: \t {}\nGPU Excluded:\t No\n",
                    d.bdf,
                    gpu_uuid(d.bdf)
                ),
            )?;
            w(&out.join(format!("dev/nvidia{minor}")), "simulated GPU device file (railguard fixture)\n")?;
        }
        Ok(())
    }
}

/// The UUID the fixture's driver gives the GPU at `bdf` (a fixed function of the address).
pub fn gpu_uuid(bdf: railguard_schema::Bdf) -> String {
    let n = u64::from_str_radix(&bdf.to_string().replace([':', '.'], ""), 16).unwrap_or(0);
    format!("GPU-7261696c-6775-6172-6400-{n:012x}")
}

fn has_gpu(slots: &[Slot]) -> bool {
    slots.iter().any(|s| match s {
        Slot::Gpu { .. } => true,
        Slot::Switch(c) => has_gpu(c),
        _ => false,
    })
}

fn pair(gpu: usize) -> Slot {
    Slot::Switch(vec![Slot::Gpu { audio: false }, Slot::Nic { names: vec![format!("mlx5_{gpu}")], ports: 1 }])
}

/// The seed incident's node: KVM guest, PCIe passthrough, 8×H200 + 8×ConnectX-7, GPU i and
/// mlx5_i under one PCIe switch, two NUMA nodes (one host bridge each), no vIOMMU,
/// nvidia-peermem loaded.
pub fn seed_kvm_guest() -> FixtureSpec {
    FixtureSpec {
        hypervisor: Some("QEMU".into()),
        iommu_device: false,
        iommu_group_type: None,
        cmdline: String::new(),
        peermem: true,
        nvidia_module: None,
        driver_version: None,
        kernel_release: None,
        config_readable: true,
        acs_redirect: false,
        nic_ats: false,
        roots: vec![
            RootSpec { domain: 0, bus: 0x00, numa: 0, ports: (0..4).map(pair).collect(), direct: vec![Slot::EthNic] },
            RootSpec { domain: 0, bus: 0x80, numa: 1, ports: (4..8).map(pair).collect(), direct: vec![] },
        ],
    }
}

/// A DGX-H100-like bare-metal box: two sockets, each GPU with its NIC under one switch, every
/// switch on its own host bridge; IOMMU in passthrough; a dual-function storage NIC.
pub fn dgx_h100_like() -> FixtureSpec {
    let socket = |first: usize, base: u8, numa: i32| -> Vec<RootSpec> {
        (0..4)
            .map(|i| RootSpec {
                domain: 0,
                bus: base + (i as u8) * 0x10,
                numa,
                ports: vec![pair(first + i)],
                direct: vec![],
            })
            .collect()
    };
    let mut roots = socket(0, 0x10, 0);
    roots.push(RootSpec {
        domain: 0,
        bus: 0x50,
        numa: 0,
        ports: vec![Slot::Nic { names: vec!["mlx5_8".into(), "mlx5_9".into()], ports: 1 }],
        direct: vec![],
    });
    roots.extend(socket(4, 0x90, 1));
    FixtureSpec {
        hypervisor: None,
        iommu_device: true,
        iommu_group_type: Some("identity".into()),
        cmdline: "iommu=pt".into(),
        peermem: true,
        nvidia_module: None,
        driver_version: None,
        kernel_release: None,
        config_readable: true,
        acs_redirect: false,
        nic_ats: false,
        roots,
    }
}

/// A KVM guest with one GPU and one RDMA NIC named `rxe0` under one switch, no vIOMMU, and no
/// GPUDirect path (the proprietary driver without nvidia-peermem): the project's Soft-RoCE VM
/// as a node whose pair's NIC is the VM's real `rxe0`, so a probe there moves the bytes by that
/// NIC's own DMA, in host memory, which is this node's KV path.
pub fn rxe_guest() -> FixtureSpec {
    FixtureSpec {
        hypervisor: Some("QEMU".into()),
        iommu_device: false,
        iommu_group_type: None,
        cmdline: String::new(),
        peermem: false,
        nvidia_module: Some("proprietary".into()),
        driver_version: None,
        kernel_release: Some("6.1.0-57-amd64".into()),
        config_readable: true,
        acs_redirect: false,
        nic_ats: false,
        roots: vec![RootSpec {
            domain: 0,
            bus: 0x00,
            numa: 0,
            ports: vec![Slot::Switch(vec![
                Slot::Gpu { audio: false },
                Slot::Nic { names: vec!["rxe0".into()], ports: 1 },
            ])],
            direct: vec![],
        }],
    }
}

/// A flat cloud VM: GPUs straight on the root bus (with their audio functions), a virtio NIC,
/// no RDMA, no NUMA information.
pub fn flat_cloud_vm() -> FixtureSpec {
    FixtureSpec {
        hypervisor: Some("Google".into()),
        iommu_device: false,
        iommu_group_type: None,
        cmdline: String::new(),
        peermem: false,
        nvidia_module: None,
        driver_version: None,
        kernel_release: None,
        config_readable: false,
        acs_redirect: false,
        nic_ats: false,
        roots: vec![RootSpec {
            domain: 0,
            bus: 0,
            numa: -1,
            ports: vec![],
            direct: vec![Slot::EthNic, Slot::Gpu { audio: true }, Slot::Gpu { audio: true }],
        }],
    }
}

/// Bare metal, two sockets, a translating IOMMU and ACS redirect on: GPUs on socket 0, one NIC
/// beside GPU0 under a switch, one dual-port NIC on socket 1.
pub fn two_socket_translating() -> FixtureSpec {
    FixtureSpec {
        hypervisor: None,
        iommu_device: true,
        iommu_group_type: Some("DMA-FQ".into()),
        cmdline: "intel_iommu=on".into(),
        peermem: false,
        nvidia_module: None,
        driver_version: None,
        kernel_release: None,
        config_readable: true,
        acs_redirect: true,
        nic_ats: false,
        roots: vec![
            RootSpec {
                domain: 0,
                bus: 0,
                numa: 0,
                ports: vec![
                    Slot::Switch(vec![
                        Slot::Gpu { audio: false },
                        Slot::Nic { names: vec!["mlx5_0".into()], ports: 1 },
                    ]),
                    Slot::Gpu { audio: false },
                ],
                direct: vec![],
            },
            RootSpec {
                domain: 0,
                bus: 0x80,
                numa: 1,
                ports: vec![Slot::Nic { names: vec!["mlx5_1".into()], ports: 2 }],
                direct: vec![],
            },
        ],
    }
}

/// A large node for benchmarks: `n` GPU/NIC pairs, each under a switch, on two sockets.
pub fn many_pairs(n: usize) -> FixtureSpec {
    let half = n.div_ceil(2);
    let mut spec = seed_kvm_guest();
    spec.roots = vec![
        RootSpec { domain: 0, bus: 0x00, numa: 0, ports: (0..half).map(pair).collect(), direct: vec![] },
        RootSpec { domain: 0, bus: 0x80, numa: 1, ports: (half..n).map(pair).collect(), direct: vec![] },
    ];
    spec
}
