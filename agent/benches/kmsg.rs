//! Kernel-log parse throughput: lines/s over a realistic mix (most lines are not events).
//!
//! Run: `cargo bench -p railguard-agent --bench kmsg`.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use railguard_agent::signals::kmsg::{KnownDevices, parse_line};
use railguard_schema::Bdf;

fn main() {
    let events = [
        "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "DMAR: [DMA Read NO_PASID] Request device [00:02.0] fault addr 0x0 [fault reason 0x06] PTE Read access is not set",
        "mlx5_core 0000:28:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0035 address=0x7fffff00000 flags=0x0000]",
        "mlx5_core 0000:3b:00.0 mlx5_3: Error cqe on cqn 0x4a1, ci 0x1f, qn 0x2c8, opcode 0xd, syndrome 0x4, vendor syndrome 0x32",
        "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
    ];
    let noise = [
        "eth0: Link is Up - 100Gbps/Full - flow control off",
        "systemd[1]: Started Session 42 of User root.",
        "EXT4-fs (vda1): mounted filesystem with ordered data mode. Quota mode: none.",
        "audit: type=1400 audit(1700000000.000:42): apparmor=\"STATUS\" operation=\"profile_load\"",
        "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
    ];
    let lines: Vec<&str> =
        (0..1_000_000).map(|i| if i % 10 == 0 { events[i / 10 % 5] } else { noise[i % 5] }).collect();
    let known = KnownDevices((0..64).map(|b| Bdf::new(0, b, 0, 0)).collect());
    let mut best = f64::MAX;
    let mut found = 0;
    for _ in 0..5 {
        let t = Instant::now();
        found = lines.iter().filter(|l| parse_line(l, &known).is_some()).count();
        best = best.min(t.elapsed().as_secs_f64());
    }
    assert_eq!(found, 100_000);
    println!("kmsg parse benchmark: 1,000,000 lines (10% events), one core");
    println!("  {:.2} M lines/s", lines.len() as f64 / best / 1e6);
}
