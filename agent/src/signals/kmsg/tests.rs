use super::*;

fn p(line: &str) -> KernelEvent {
    parse_line(line, &DomainZero).unwrap_or_else(|| panic!("not parsed: {line}"))
}

#[test]
fn intel_dmar_fault() {
    let e = p(
        "DMAR: [DMA Read NO_PASID] Request device [00:02.0] fault addr 0x0 [fault reason 0x06] PTE Read access is not set",
    );
    assert_eq!(e.kind, SignalKind::DmarFault);
    assert_eq!(e.bdf, Some(Bdf::new(0, 0, 2, 0)));
    assert_eq!(e.attrs["access"], "DMA Read NO_PASID");
    assert_eq!(e.attrs["address"], "0x0");
    assert_eq!(e.attrs["reason"], "0x06");
    assert_eq!(e.attrs["reason_text"], "PTE Read access is not set");
    let known = KnownDevices(vec![Bdf::new(2, 0x3b, 0, 0), Bdf::new(0, 0x18, 0, 0)]);
    let e = parse_line(
        "DMAR: [DMA Write] Request device [3b:00.0] PASID ffffffff fault addr 7fff0000 [fault reason 05] PTE Write access is not set",
        &known,
    )
    .unwrap();
    assert_eq!(e.bdf, Some(Bdf::new(2, 0x3b, 0, 0)), "domain resolved against the node's devices");
}

#[test]
fn amd_vi_both_forms() {
    let e = p(
        "mlx5_core 0000:28:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0035 address=0x7fffff00000 flags=0x0000]",
    );
    assert_eq!(e.kind, SignalKind::AmdViPageFault);
    assert_eq!(e.bdf, Some(Bdf::new(0, 0x28, 0, 0)));
    assert_eq!(e.attrs["domain"], "0x0035");
    assert_eq!(e.attrs["address"], "0x7fffff00000");
    let e = p("AMD-Vi: Event logged [IO_PAGE_FAULT device=07:00.0 domain=0x000e address=0x1000 flags=0x0020]");
    assert_eq!(e.bdf, Some(Bdf::new(0, 7, 0, 0)));
    assert_eq!(e.attrs["flags"], "0x0020");
}

#[test]
fn nvidia_xid_with_and_without_mig() {
    let e = p("NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.");
    assert_eq!(e.kind, SignalKind::GpuXid);
    assert_eq!(e.bdf, Some(Bdf::new(0, 0x91, 0, 0)));
    assert_eq!(e.attrs["xid"], "79");
    assert_eq!(e.attrs["pid"], "<unknown>");
    assert_eq!(e.attrs["text"], "GPU has fallen off the bus.");
    let e = p(
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 31, pid=1234, name=python3, Ch 00000008, intr 00000000. MMU Fault",
    );
    assert_eq!(e.attrs["xid"], "31");
    assert_eq!(e.attrs["gpu_i"], "01");
    assert_eq!(e.attrs["gpu_ci"], "00");
    assert_eq!(e.attrs["pid"], "1234");
    assert_eq!(e.bdf, Some(Bdf::new(0, 0x3b, 0, 0)));
}

#[test]
fn mlx5_error_cqe() {
    let e = p(
        "mlx5_core 0000:3b:00.0 mlx5_3: Error cqe on cqn 0x4a1, ci 0x1f, qn 0x2c8, opcode 0xd, syndrome 0x4, vendor syndrome 0x32",
    );
    assert_eq!(e.kind, SignalKind::Mlx5ErrorCqe);
    assert_eq!(e.bdf, Some(Bdf::new(0, 0x3b, 0, 0)));
    assert_eq!(e.rdma_dev.as_deref(), Some("mlx5_3"));
    assert_eq!(e.attrs["syndrome"], "0x4");
    assert_eq!(e.attrs["syndrome_name"], "local protection error");
    assert_eq!(e.attrs["vendor_syndrome"], "0x32");
    assert_eq!(e.attrs["qn"], "0x2c8");
}

#[test]
fn pcie_aer() {
    let e = p("pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0");
    assert_eq!(e.kind, SignalKind::PcieAer);
    assert_eq!(e.bdf, Some(Bdf::new(0, 1, 0, 0)));
    assert_eq!(e.attrs["severity"], "Corrected");
    assert_eq!(e.attrs["port"], "0000:00:01.0");
    let e = p("pcieport 0000:80:03.1: AER: Uncorrected (Non-Fatal) error received: 0000:83:00.0");
    assert_eq!(e.attrs["severity"], "Uncorrected (Non-Fatal)");
}

#[test]
fn records_and_other_lines() {
    let r = parse_record("3,1234,5678901,-;NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n SUBSYSTEM=pci\n").unwrap();
    assert_eq!((r.priority, r.seq, r.timestamp_us), (3, 1234, 5678901));
    assert!(r.message.starts_with("NVRM: Xid"));
    assert!(parse_record("garbage").is_none());
    assert!(parse_line("eth0: link up", &DomainZero).is_none());
    assert!(parse_line("NVRM: Xid (PCI:zz): x", &DomainZero).is_none());
    assert!(parse_line("DMAR: [DMA Read] Request device [zz:00.0]", &DomainZero).is_none());
}

#[test]
fn random_and_mangled_lines_never_panic() {
    use rand::{Rng, SeedableRng};
    let seeds = [
        "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "DMAR: [DMA Read NO_PASID] Request device [00:02.0] fault addr 0x0 [fault reason 0x06] PTE Read access is not set",
        "mlx5_core 0000:28:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0035 address=0x7fffff00000 flags=0x0000]",
        "mlx5_core 0000:3b:00.0 mlx5_3: Error cqe on cqn 0x4a1, ci 0x1f, qn 0x2c8, opcode 0xd, syndrome 0x4, vendor syndrome 0x32",
        "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
        "pcieport 0000:00:01.0: AER: Corrected error received: 0000:00:03:0",
        "infiniband mlx5_3: mlx5_handle_error_cqe:333:(pid 4242): WC error: 10, Message: remote access error",
        "infiniband mlx5_2: mlx5_poll_one:654:(pid 9): Requestor error cqe on cqn 0x3f:",
        "infiniband mlx5_2: mlx5_poll_one:657:(pid 9): syndrome 0x4, vendor syndrome 0x51",
        "mlx5_core 0000:08:00.0: mlx5_health_check:812:(pid 0): Fatal error 1 detected",
        "IO_PAGE_FAULT device=07:00.0 domain=0x000e address=0xfffff000 flags=0x0020]",
    ];
    let mut parser = LineParser::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for _ in 0..20_000 {
        let base = seeds[rng.random_range(0..seeds.len())];
        let mut chars: Vec<char> = base.chars().collect();
        for _ in 0..rng.random_range(1..6) {
            if chars.is_empty() {
                break;
            }
            let i = rng.random_range(0..chars.len());
            match rng.random_range(0..3) {
                0 => {
                    chars.remove(i);
                }
                1 => chars.insert(i, char::from_u32(rng.random_range(0..0x3000)).unwrap_or('x')),
                _ => chars.truncate(i),
            }
        }
        let line: String = chars.into_iter().collect();
        let _ = parse_line(&line, &DomainZero);
        let _ = parser.parse(&line, &DomainZero);
        let _ = parse_record(&line);
    }
}

#[test]
fn mlx5_ib_wc_error_lines_current_form() {
    let e = p("infiniband mlx5_3: mlx5_handle_error_cqe:333:(pid 4242): WC error: 10, Message: remote access error");
    assert_eq!(e.kind, SignalKind::Mlx5ErrorCqe);
    assert_eq!(e.rdma_dev.as_deref(), Some("mlx5_3"));
    assert_eq!(e.attrs["wc_status"], "10");
    assert_eq!(e.attrs["wc_status_name"], "IBV_WC_REM_ACCESS_ERR");
    assert_eq!(e.attrs["message"], "remote access error");
    assert_eq!(e.attrs["pid"], "4242");
    // Older prefix (pr_debug with the device name first), lower-case "message".
    let e = p("mlx5_0:mlx5_handle_error_cqe:289:(pid 77): WC error: 4, message: local protection error");
    assert_eq!((e.rdma_dev.as_deref(), e.attrs["wc_status_name"].as_str()), (Some("mlx5_0"), "IBV_WC_LOC_PROT_ERR"));
    // Not a number: not an event.
    assert!(parse_line("infiniband mlx5_0: x:1:(pid 1): WC error: ten, Message: ?", &DomainZero).is_none());
}

#[test]
fn mlx5_ib_two_line_error_cqe_is_joined() {
    let mut parser = LineParser::default();
    let first = "infiniband mlx5_2: mlx5_poll_one:654:(pid 9): Requestor error cqe on cqn 0x3f:";
    assert!(parser.parse(first, &DomainZero).is_none(), "waits for the syndrome line");
    // Another device's line in between does not disturb it.
    assert!(
        parser
            .parse("infiniband mlx5_7: mlx5_poll_one:654:(pid 9): Responder error cqe on cqn 0x11:", &DomainZero)
            .is_none()
    );
    let e = parser
        .parse("infiniband mlx5_2: mlx5_poll_one:657:(pid 9): syndrome 0x4, vendor syndrome 0x51", &DomainZero)
        .unwrap();
    assert_eq!(e.kind, SignalKind::Mlx5ErrorCqe);
    assert_eq!(e.rdma_dev.as_deref(), Some("mlx5_2"));
    assert_eq!((e.attrs["side"].as_str(), e.attrs["cqn"].as_str()), ("requester", "0x3f"));
    assert_eq!((e.attrs["syndrome"].as_str(), e.attrs["vendor_syndrome"].as_str()), ("0x4", "0x51"));
    assert_eq!(e.attrs["syndrome_name"], "local protection error");
    // A first line whose second never came is emitted when that device's next one arrives.
    let orphan =
        parser.parse("infiniband mlx5_7: mlx5_poll_one:654:(pid 9): Requestor error cqe on cqn 0x12:", &DomainZero);
    assert_eq!(orphan.unwrap().attrs["cqn"], "0x11");
    // Single-line forms go through unchanged.
    assert!(
        parser
            .parse(
                "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
                &DomainZero
            )
            .is_some()
    );
}

#[test]
fn mlx5_core_health_and_recovery_lines() {
    for (line, event) in [
        ("mlx5_core 0000:08:00.0: mlx5_health_check:812:(pid 0): Fatal error 1 detected", "fatal_error"),
        (
            "mlx5_core 0000:08:00.0: poll_health:811:(pid 0): device's health compromised - reached miss count",
            "health_compromised",
        ),
        ("mlx5_core 0000:08:00.0: mlx5_health_try_recover:320:(pid 1022): handling bad device here", "bad_device"),
        (
            "mlx5_core 0000:08:00.0: mlx5_health_try_recover:328:(pid 1022): starting health recovery flow",
            "recovery_started",
        ),
        (
            "mlx5_core 0000:08:00.0: mlx5_health_try_recover:336:(pid 1022): health recovery flow aborted, PCI reads still not working",
            "recovery_aborted",
        ),
        (
            "mlx5_core 0000:08:00.0: mlx5_fw_fatal_reporter_err_work:650:(pid 1022): Driver is in error state. Unloading",
            "driver_error_state",
        ),
    ] {
        let e = p(line);
        assert_eq!((e.kind, e.attrs["event"].as_str()), (SignalKind::NicHealthReport, event), "{line}");
        assert_eq!(e.bdf, Some(Bdf::new(0, 8, 0, 0)));
    }
    // Other drivers' "fatal error" lines are not mlx5 health reports.
    assert!(parse_line("nvme 0000:01:00.0: Fatal error detected", &DomainZero).is_none());
}

#[test]
fn amd_vi_event_printed_as_a_continuation_line() {
    let known = KnownDevices(vec![Bdf::new(1, 7, 0, 0)]);
    let e = parse_line("IO_PAGE_FAULT device=07:00.0 domain=0x000e address=0xfffff000 flags=0x0020]", &known).unwrap();
    assert_eq!(e.kind, SignalKind::AmdViPageFault);
    assert_eq!(e.bdf, Some(Bdf::new(1, 7, 0, 0)), "domain resolved against the node's devices");
    assert_eq!((e.attrs["address"].as_str(), e.attrs["flags"].as_str()), ("0xfffff000", "0x0020"));
    assert!(parse_line("IO_PAGE_FAULT device=zz:00.0 domain=0x000e", &known).is_none());
}

#[test]
fn aer_source_ids_with_a_colon_before_the_function() {
    let e = p("pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:00:03:0");
    assert_eq!(e.kind, SignalKind::PcieAer);
    assert_eq!(e.bdf, Some(Bdf::new(0, 0, 3, 0)));
    assert_eq!(e.attrs["port"], "0000:00:01.0");
    let e = p("pcieport 0000:80:01.0: AER: Corrected error received: 0000:81:00:1");
    assert_eq!(e.bdf, Some(Bdf::new(0, 0x81, 0, 1)));
}

#[test]
fn dmar_requester_printed_with_hex_prefixes() {
    // Some kernels print the requester's bus and slot with `0x` (`[0x%02x:0x%02x.%d]`).
    let e = p(
        "DMAR: [DMA Read NO_PASID] Request device [0x3b:0x00.0] fault addr 0xfff00000 [fault reason 0x06] PTE Read access is not set",
    );
    assert_eq!(e.kind, SignalKind::DmarFault);
    assert_eq!(e.bdf, Some(Bdf::new(0, 0x3b, 0, 0)));
    assert_eq!(e.attrs["reason"], "0x06");
    let e = p(
        "DMAR: [DMA Write NO_PASID] Request device [0x00:0x02.0] fault addr 0x0 [fault reason 0x05] PTE Write access is not set",
    );
    assert_eq!(e.bdf, Some(Bdf::new(0, 0, 2, 0)));
}

#[test]
fn mlx5_poll_one_lines_from_a_roce_device_named_by_its_pci_address() {
    // rdma-core's udev rules name RoCE devices by PCI address (`rocep<bus>s<slot>f<fn>`, decimal):
    // rocep59s0f1 is 0000:3b:00.1. mlx5_ib prints its older two-record error CQE through the
    // device, so the line carries that name and no PCI address.
    let mut parser = LineParser::default();
    let first = "infiniband rocep59s0f1: mlx5_poll_one:698:(pid 48213): Requestor error cqe on cqn 0x3f:";
    assert!(parser.parse(first, &DomainZero).is_none(), "the first half waits for the second");
    let e = parser
        .parse("infiniband rocep59s0f1: mlx5_poll_one:703:(pid 48213): syndrome 0x4, vendor syndrome 0x51", &DomainZero)
        .unwrap();
    assert_eq!(e.kind, SignalKind::Mlx5ErrorCqe);
    assert_eq!(e.rdma_dev.as_deref(), Some("rocep59s0f1"));
    assert_eq!(e.bdf, Some(Bdf::new(0, 0x3b, 0, 1)), "placed at the PCI address the name spells");
    assert_eq!(e.attrs["syndrome"], "0x4");
    assert_eq!(e.attrs["syndrome_name"], "local protection error");
    assert_eq!(e.attrs["side"], "requester");
    // The same line alone (its first half lost), and the InfiniBand and domain forms.
    let e = LineParser::default()
        .parse(
            "infiniband rocep59s0f1: mlx5_poll_one:703:(pid 48213): syndrome 0x13, vendor syndrome 0x88",
            &DomainZero,
        )
        .unwrap();
    assert_eq!((e.bdf, e.attrs["syndrome_name"].as_str()), (Some(Bdf::new(0, 0x3b, 0, 1)), "remote access error"));
    assert_eq!(pci_named_rdma_dev("ibp94s0f0"), Some(Bdf::new(0, 94, 0, 0)));
    assert_eq!(pci_named_rdma_dev("roceP2p3s4"), Some(Bdf::new(2, 3, 4, 0)));
    assert_eq!(pci_named_rdma_dev("rocep300s0f0"), None, "no bus 300");
    assert_eq!(pci_named_rdma_dev("roce_x"), None);
}

#[test]
fn aer_lines_in_syslog_form() {
    // As rsyslog writes the kernel's lines to /var/log/kern.log: date, host, `kernel:`, then the
    // kernel's own timestamp.
    let e = p(
        "Dec  4 10:11:12 gpu-node-07 kernel: [123456.789012] pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:3b:00.0",
    );
    assert_eq!(e.kind, SignalKind::PcieAer);
    assert_eq!(e.bdf, Some(Bdf::new(0, 0x3b, 0, 0)));
    assert_eq!(e.attrs["severity"], "Uncorrected (Non-Fatal)");
    assert_eq!(e.attrs["port"], "0000:00:01.0");
    let e = p(
        "2026-12-04T10:11:12.345678+00:00 gpu-node-07 kernel: [ 8123.000001] pcieport 0000:80:03.1: AER: Corrected error received: 0000:81:00.0",
    );
    assert_eq!((e.bdf, e.attrs["severity"].as_str()), (Some(Bdf::new(0, 0x81, 0, 0)), "Corrected"));
    // The device line that follows, in the same form.
    let e = p(
        "Dec  4 10:11:12 gpu-node-07 kernel: [123456.789015] mlx5_core 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Requester ID)",
    );
    assert_eq!((e.kind, e.bdf), (SignalKind::PcieAer, Some(Bdf::new(0, 0x3b, 0, 0))));
    assert_eq!(e.attrs["severity"], "Uncorrected (Non-Fatal)");
}
