//! Topology discovery on fixture trees laid out like real sysfs, and on this machine's /sys.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use railguard_agent::topology::fixture::{self, FixtureSpec};
use railguard_agent::topology::predict::NetDevices;
use railguard_agent::topology::risk::assess_gpu;
use railguard_agent::topology::{SelectionPolicy, SysRoot, Topology, render};
use railguard_schema::{PathClass, RiskLevel, Tristate};

fn discover(spec: &FixtureSpec) -> (tempfile::TempDir, Topology) {
    let dir = tempfile::tempdir().unwrap();
    spec.write(dir.path()).unwrap();
    let topo = Topology::discover(&SysRoot::new(dir.path().join("sys")), &SysRoot::new(dir.path().join("proc")));
    (dir, topo)
}

fn pinned(v: &str) -> SelectionPolicy {
    SelectionPolicy { ucx: NetDevices::parse(v), ..Default::default() }
}

/// The GPU×NIC part of the matrix, one line per GPU, as nvidia-smi prints the labels.
fn gpu_nic_rows(t: &Topology) -> Vec<String> {
    (0..t.gpus.len()).map(|g| t.gpu_nic[g].iter().map(|c| c.label()).collect::<Vec<_>>().join(" ")).collect()
}

#[test]
fn seed_guest_every_gpu_is_pix_with_its_nic_and_at_risk_under_auto_selection() {
    let (_d, t) = discover(&fixture::seed_kvm_guest());
    assert_eq!(t.gpus.len(), 8);
    assert_eq!(t.nics.len(), 8, "the virtio NIC is not an RDMA NIC");
    for g in 0..8 {
        assert_eq!(t.nics[g].nic.name, format!("mlx5_{g}"));
        assert_eq!(t.gpu_nic[g][g], PathClass::Pix, "GPU{g}");
    }
    assert_eq!(t.host.facts.virtualized, Tristate::Yes);
    assert_eq!(t.host.facts.viommu, Tristate::No);
    assert_eq!(t.host.facts.gpudirect, "nvidia-peermem");
    assert_eq!(gpu_nic_rows(&t)[0], "PIX PHB PHB PHB SYS SYS SYS SYS");
    assert_eq!(gpu_nic_rows(&t)[5], "SYS SYS SYS SYS PHB PIX PHB PHB");

    let auto = SelectionPolicy::default();
    for g in 0..8 {
        let a = assess_gpu(&t, g, &auto);
        assert_eq!(a.level, RiskLevel::High, "GPU{g}: {:?}", a.reasons);
        assert_eq!(a.prediction.predicted_nic.as_deref(), Some(format!("mlx5_{g}").as_str()));
        assert_eq!(a.prediction.affine_nic, a.prediction.predicted_nic);
        assert!(a.prediction.nccl_gdr);
        assert!(a.reasons.iter().any(|r| r.contains("bypasses the host IOMMU")), "{:?}", a.reasons);
    }
    let a0 = assess_gpu(&t, 0, &auto);
    assert_eq!(a0.safe_nics, ["mlx5_1", "mlx5_2", "mlx5_3"], "root-complex paths on GPU0's NUMA node");
}

#[test]
fn seed_guest_pinned_to_mlx5_0_leaves_exactly_gpu0_at_risk() {
    let (_d, t) = discover(&fixture::seed_kvm_guest());
    let policy = pinned("mlx5_0:1");
    let at_risk: Vec<u32> =
        (0..8).map(|g| assess_gpu(&t, g, &policy)).filter(|a| a.level >= RiskLevel::Medium).map(|a| a.gpu).collect();
    assert_eq!(at_risk, [0], "the per-pod check that 'passed 7 of 8'");
    for g in 1..8 {
        let a = assess_gpu(&t, g, &policy);
        assert_eq!(a.level, RiskLevel::None);
        assert!(a.prediction.pinned);
        assert!(a.reasons.iter().any(|r| r.contains("crosses the root complex")), "GPU{g}: {:?}", a.reasons);
    }
}

#[test]
fn dgx_like_bare_metal_matrix_and_no_risk_with_iommu_passthrough() {
    let (_d, t) = discover(&fixture::dgx_h100_like());
    assert_eq!(t.host.facts.virtualized, Tristate::No);
    assert_eq!(t.host.facts.kernel_iommu_flags, "iommu=pt");
    let rows = gpu_nic_rows(&t);
    // NIC8/NIC9 are the two functions of the storage NIC on socket 0.
    assert_eq!(rows[0], "PIX NODE NODE NODE SYS SYS SYS SYS NODE NODE");
    assert_eq!(rows[7], "SYS SYS SYS SYS NODE NODE NODE PIX SYS SYS");
    assert_eq!(t.nic_nic[8][9], PathClass::Pix, "functions of one card");
    for g in 0..8 {
        assert_eq!(assess_gpu(&t, g, &SelectionPolicy::default()).level, RiskLevel::None);
    }
}

#[test]
fn flat_cloud_vm_gpus_skip_audio_functions_and_have_no_nics() {
    let (_d, t) = discover(&fixture::flat_cloud_vm());
    assert_eq!(t.gpus.len(), 2, "NVIDIA audio functions are not GPUs");
    assert!(t.nics.is_empty(), "virtio-net is not RDMA");
    assert_eq!(t.gpus[0].gpu.numa_node, -1);
    assert_eq!(t.gpu_gpu[0][1], PathClass::Phb);
    assert_eq!(t.host.facts.hypervisor, "google-compute-engine");
    let a = assess_gpu(&t, 0, &SelectionPolicy::default());
    assert_eq!(a.level, RiskLevel::None);
    assert!(a.reasons[0].contains("no RDMA NIC"));
}

#[test]
fn two_socket_bare_metal_acs_decides_between_performance_note_and_risk() {
    let mut spec = fixture::two_socket_translating();
    let (_d, t) = discover(&spec);
    assert_eq!(gpu_nic_rows(&t), ["PIX SYS", "PHB SYS"]);
    assert_eq!(t.nics[1].nic.ports.len(), 2, "dual-port NIC");
    assert_eq!(t.nics[1].nic.ports[1].state, "ACTIVE");
    let a = assess_gpu(&t, 0, &SelectionPolicy::default());
    assert_eq!(a.level, RiskLevel::Low);
    assert!(a.reasons.iter().any(|r| r.contains("performance note")), "{:?}", a.reasons);

    spec.acs_redirect = false;
    let (_d, t) = discover(&spec);
    let a = assess_gpu(&t, 0, &SelectionPolicy::default());
    assert_eq!(a.level, RiskLevel::Medium, "{:?}", a.reasons);

    spec.config_readable = false;
    let (_d, t) = discover(&spec);
    let a = assess_gpu(&t, 0, &SelectionPolicy::default());
    assert_eq!(a.level, RiskLevel::Low);
    assert!(a.reasons.iter().any(|r| r.contains("unreadable")), "{:?}", a.reasons);
    assert!(
        t.acs.values().all(|a| a.redirect() == Tristate::Unknown),
        "64 bytes of config space is unknown, never off"
    );
}

#[test]
fn a_guest_with_viommu_and_nic_ats_is_low_risk() {
    let mut spec = fixture::seed_kvm_guest();
    spec.iommu_device = true;
    let (_d, t) = discover(&spec);
    assert_eq!(t.host.facts.viommu, Tristate::Yes);
    assert_eq!(assess_gpu(&t, 0, &SelectionPolicy::default()).level, RiskLevel::Medium);
    spec.nic_ats = true;
    let (_d, t) = discover(&spec);
    assert_eq!(assess_gpu(&t, 0, &SelectionPolicy::default()).level, RiskLevel::Low);
}

#[test]
fn this_machines_real_sys_has_no_gpus_no_rdma_and_is_a_guest_without_viommu() {
    let t = Topology::discover(&SysRoot::new("/sys"), &SysRoot::new("/proc"));
    assert!(t.gpus.is_empty());
    assert!(t.nics.is_empty());
    assert_eq!(t.host.facts.virtualized, Tristate::Yes, "this CI machine is a virtio guest");
    assert_eq!(t.host.facts.viommu, Tristate::No);
    let _ = render::matrix(&t, &SelectionPolicy::default());
}

#[test]
fn json_report_follows_the_contract() {
    let (_d, t) = discover(&fixture::seed_kvm_guest());
    let v = render::json_report(&t, &SelectionPolicy::default());
    assert_eq!(v["host"]["virtualized"], true);
    assert_eq!(v["host"]["viommu"], false);
    assert_eq!(v["host"]["gpudirect"], "nvidia-peermem");
    assert_eq!(v["gpus"][3]["index"], 3);
    assert_eq!(v["gpus"][3]["numa_node"], 0);
    assert!(v["gpus"][3]["bdf"].as_str().unwrap().starts_with("0000:"));
    assert_eq!(v["nics"][3]["name"], "mlx5_3");
    assert_eq!(v["gpu_nic"]["GPU3"]["mlx5_3"], "PIX");
    assert_eq!(v["gpu_gpu"]["GPU0"]["GPU4"], "SYS");
    assert_eq!(v["gpus"][3]["risk"]["level"], "high");
    assert_eq!(v["gpus"][3]["risk"]["affine_nic"], "mlx5_3");
    assert_eq!(v["gpus"][3]["risk"]["safe_nics"][0], "mlx5_0");
    assert!(v["gpus"][3]["risk"]["reasons"].as_array().unwrap().len() >= 2);
}

#[test]
fn topology_becomes_a_valid_collector_record() {
    let (_d, t) = discover(&fixture::seed_kvm_guest());
    let snap = t.to_snapshot(&SelectionPolicy::default());
    assert_eq!(snap.paths.iter().filter(|p| p.class == PathClass::Pix).count(), 8);
    let rec = railguard_schema::Record::now(railguard_schema::RecordBody::Topology(snap.clone()));
    let wire: railguard_schema::wire::Record = rec.clone().into();
    let back = railguard_schema::Record::try_from(wire).unwrap();
    assert_eq!(back, rec);
    assert_eq!(snap.risks.iter().filter(|r| r.level == RiskLevel::High).count(), 8);
}

#[test]
fn snapshot_captures_exactly_what_topo_reads() {
    let d = tempfile::tempdir().unwrap();
    fixture::seed_kvm_guest().write(&d.path().join("m")).unwrap();
    let tgz = d.path().join("snap.tar.gz");
    let n =
        railguard_agent::topology::snapshot::capture(&d.path().join("m/sys"), &d.path().join("m/proc"), &tgz).unwrap();
    assert!(n > 50, "{n} entries");
    let out = d.path().join("unpacked");
    let f = std::fs::File::open(&tgz).unwrap();
    tar::Archive::new(flate2::read::GzDecoder::new(f)).unpack(&out).unwrap();
    let orig = Topology::discover(&SysRoot::new(d.path().join("m/sys")), &SysRoot::new(d.path().join("m/proc")));
    let again = Topology::discover(&SysRoot::new(out.join("sys")), &SysRoot::new(out.join("proc")));
    let policy = SelectionPolicy::default();
    assert_eq!(render::json_report(&again, &policy), render::json_report(&orig, &policy));
    // Nothing beyond what is read: hw_counters are not part of topology.
    assert!(!out.join("sys/class/infiniband/mlx5_0/ports/1/hw_counters").exists());
    assert!(!out.join("sys/devices").read_dir().unwrap().any(|e| e.unwrap().file_name() == "virtual"));
}

#[test]
fn broken_trees_give_partial_results_and_warnings_never_panics() {
    let d = tempfile::tempdir().unwrap();
    fixture::seed_kvm_guest().write(d.path()).unwrap();
    let sys = d.path().join("sys");
    let gpu0 = railguard_agent::topology::pci::enumerate(&SysRoot::new(&sys), &mut Vec::new())
        .into_iter()
        .find(|d| d.is_nvidia_gpu())
        .unwrap()
        .bdf
        .to_string();
    let gpu0_dir = std::fs::canonicalize(sys.join("bus/pci/devices").join(&gpu0)).unwrap();
    std::fs::remove_file(gpu0_dir.join("vendor")).unwrap(); // missing file
    let devs = sys.join("bus/pci/devices");
    std::os::unix::fs::symlink("nowhere", devs.join("0000:ff:00.0")).unwrap(); // dangling
    std::os::unix::fs::symlink("0000:fe:00.1", devs.join("0000:fe:00.0")).unwrap(); // loop
    std::os::unix::fs::symlink("0000:fe:00.0", devs.join("0000:fe:00.1")).unwrap();
    std::os::unix::fs::symlink("x", devs.join("not-a-bdf")).unwrap();
    std::fs::write(sys.join("class/infiniband/mlx5_1/device/numa_node"), "garbage").unwrap();
    std::fs::write(sys.join("class/infiniband/mlx5_2/ports/1/state"), [0xff, 0xfe, 0]).unwrap();
    std::fs::remove_file(sys.join("class/infiniband/mlx5_3/device")).unwrap();
    std::fs::write(d.path().join("proc/cpuinfo"), [0u8, 159, 146, 150]).unwrap();
    let t = Topology::discover(&SysRoot::new(&sys), &SysRoot::new(d.path().join("proc")));
    assert_eq!(t.gpus.len(), 7, "the GPU without a vendor file is skipped");
    assert_eq!(t.nics.len(), 7, "mlx5_3 without a device link is skipped");
    for w in ["0000:ff:00.0", "0000:fe:00.0", "not-a-bdf", "mlx5_3", gpu0.as_str()] {
        assert!(t.warnings.iter().any(|x| x.contains(w)), "no warning about {w}: {:?}", t.warnings);
    }
    assert_eq!(t.nics.iter().find(|n| n.nic.name == "mlx5_1").unwrap().nic.numa_node, -1);
    let _ = render::matrix(&t, &SelectionPolicy::default());
}

#[test]
fn random_garbage_in_every_file_never_panics() {
    use rand::{Rng, SeedableRng};
    let d = tempfile::tempdir().unwrap();
    fixture::two_socket_translating().write(d.path()).unwrap();
    let mut files = Vec::new();
    let mut stack = vec![d.path().to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap().flatten() {
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                files.push(e.path());
            }
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    // At least 10,000 garbage file contents, read back by full discoveries.
    let mut mutated = 0;
    while mutated < 10_000 {
        for f in &files {
            if rng.random_bool(0.3) {
                let len = rng.random_range(0..80);
                // Random bytes, or a plausible value gone wrong (numbers, hex, huge, negative).
                let bytes: Vec<u8> = match rng.random_range(0..3) {
                    0 => (0..len).map(|_| rng.random()).collect(),
                    1 => format!("{}", rng.random::<i64>()).into_bytes(),
                    _ => format!("0x{:x}\n", rng.random::<u64>()).into_bytes(),
                };
                std::fs::write(f, bytes).unwrap();
                mutated += 1;
            }
        }
        let t = Topology::discover(&SysRoot::new(d.path().join("sys")), &SysRoot::new(d.path().join("proc")));
        let _ = render::json_report(&t, &SelectionPolicy::default());
        let _ = render::matrix(&t, &SelectionPolicy::default());
    }
}

#[test]
fn the_gpudirect_path_comes_from_evidence_and_none_is_a_risk_of_its_own() {
    let seed = fixture::seed_kvm_guest();
    let with = |peermem: bool, module: Option<&str>, kernel: Option<&str>| FixtureSpec {
        peermem,
        nvidia_module: module.map(str::to_owned),
        kernel_release: kernel.map(str::to_owned),
        ..seed.clone()
    };
    for (spec, want) in [
        (with(true, Some("proprietary"), Some("6.1.0-57-amd64")), "nvidia-peermem"),
        // The open kernel module on a kernel with RDMA dma-buf support (5.12+).
        (with(false, Some("open"), Some("6.1.0-57-amd64")), "dma-buf"),
        // The open module on a kernel too old for it, or the proprietary module without peermem.
        (with(false, Some("open"), Some("5.4.0-150-generic")), "none"),
        (with(false, Some("proprietary"), Some("6.1.0")), "none"),
        // GPUs, but the tree says nothing of the driver.
        (with(false, None, None), "unknown"),
    ] {
        let (_d, t) = discover(&spec);
        assert_eq!(t.host.facts.gpudirect, want, "{spec:?}");
    }
    // No registration path: the NIC cannot DMA GPU memory at all, whatever the topology.
    let (_d, t) = discover(&with(false, Some("proprietary"), Some("6.1.0")));
    let a = assess_gpu(&t, 0, &SelectionPolicy::default());
    assert_eq!(a.level, RiskLevel::Low, "{:?}", a.reasons);
    assert!(a.reasons.iter().any(|r| r.contains("no GPUDirect registration path")), "{:?}", a.reasons);
    // The same node with nvidia-peermem is the seed incident again.
    let (_d, t) = discover(&with(true, Some("proprietary"), Some("6.1.0")));
    assert_eq!(assess_gpu(&t, 0, &SelectionPolicy::default()).level, RiskLevel::High);
}

#[test]
fn the_rxe_guest_has_one_pair_on_rxe0_and_no_gpudirect_path() {
    let (_d, t) = discover(&fixture::rxe_guest());
    assert_eq!((t.gpus.len(), t.nics.len(), t.nics[0].nic.name.as_str()), (1, 1, "rxe0"));
    assert_eq!(t.host.facts.gpudirect, "none", "the KV path of this node is host memory");
    assert_eq!(t.gpu_nic[0][0], PathClass::Pix);
}

/// A GPU whose `vendor` cannot be read (a removal in progress, a hostile tree) is kept in its
/// place as unreadable: the next GPU keeps its index, and with it its history and taints.
#[test]
fn an_unreadable_gpu_keeps_its_place_and_no_other_takes_its_index() {
    let d = tempfile::tempdir().unwrap();
    fixture::seed_kvm_guest().write(d.path()).unwrap();
    let sys = d.path().join("sys");
    let t = Topology::discover(&SysRoot::new(&sys), &SysRoot::new(d.path().join("proc")));
    let (gpu0, gpu1) = (t.gpus[0].gpu.bdf, t.gpus[1].gpu.bdf);
    // GPU0's vendor file becomes unreadable (a directory where a file should be); the NVIDIA
    // driver still holds the device.
    let dev = std::fs::canonicalize(sys.join(format!("bus/pci/devices/{gpu0}"))).unwrap();
    std::fs::remove_file(dev.join("vendor")).unwrap();
    std::fs::create_dir(dev.join("vendor")).unwrap();
    std::fs::create_dir_all(sys.join("bus/pci/drivers/nvidia")).unwrap();
    // An absolute link resolves inside the root, as the kernel's relative ones do.
    std::os::unix::fs::symlink("/bus/pci/drivers/nvidia", dev.join("driver")).unwrap();
    let t = Topology::discover(&SysRoot::new(&sys), &SysRoot::new(d.path().join("proc")));
    assert_eq!(t.gpus.len(), 8, "{:?}", t.warnings);
    assert_eq!((t.gpus[0].gpu.bdf, t.gpus[1].gpu.bdf), (gpu0, gpu1), "GPU1 is still GPU1");
    assert!(t.warnings.iter().any(|w| w.contains(&format!("GPU at {gpu0} is unreadable"))), "{:?}", t.warnings);
}

/// Two workloads on one GPU that select different NICs: the lowest pid's is the GPU's predicted
/// NIC; the other's is kept beside it (risk, reasons, the wire record), and both pairs are probed
/// as a workload's, never one picked silently.
#[test]
fn two_workloads_selecting_different_nics_for_one_gpu_are_both_judged_and_probed() {
    use railguard_agent::probe::pairs::{NicSelection, select_pairs};
    use railguard_agent::topology::WorkloadSelection;
    use railguard_schema::PairSelection;
    let (_d, t) = discover(&fixture::seed_kvm_guest());
    // GPU1: process 100 pinned to mlx5_2 (PHB, safe), process 205 on auto-selection (mlx5_1, PIX).
    let mut policy = SelectionPolicy::default();
    policy.per_gpu.insert(
        1,
        vec![
            WorkloadSelection { pid: 100, ucx: NetDevices::parse("mlx5_2:1"), nccl: None },
            WorkloadSelection { pid: 205, ucx: NetDevices::Auto, nccl: None },
        ],
    );
    let others = t.other_workloads(1, &policy);
    assert_eq!(others.iter().map(|o| (o.pid, o.nic.as_str())).collect::<Vec<_>>(), [(205, "mlx5_1")]);
    let a = assess_gpu(&t, 1, &policy);
    assert_eq!(a.prediction.predicted_nic.as_deref(), Some("mlx5_2"));
    assert_eq!(a.other_workload_nics, ["mlx5_1"]);
    assert_eq!(a.level, RiskLevel::High, "the other workload's PIX pair is the GPU's risk too: {:?}", a.reasons);
    assert!(
        a.reasons.iter().any(|r| r.contains("process 205 also uses GPU1 and selects mlx5_1 (PIX")),
        "{:?}",
        a.reasons
    );
    assert_eq!(a.clone().into_wire().other_workload_nics, ["mlx5_1"]);
    let pairs = select_pairs(&t, &policy, &[1], &NicSelection::Workload).unwrap();
    assert_eq!(
        pairs.iter().map(|p| (p.nic.as_str(), p.selection)).collect::<Vec<_>>(),
        [("mlx5_1", PairSelection::Predicted), ("mlx5_2", PairSelection::Pinned)]
    );
    // One workload, or two selecting the same NIC: nothing beside the predicted one.
    policy.per_gpu.get_mut(&1).unwrap()[1].ucx = NetDevices::parse("mlx5_2:1");
    assert!(t.other_workloads(1, &policy).is_empty());
}
