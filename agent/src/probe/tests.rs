use super::fault::{Fault, FaultKind};
use super::transport::sim::SimFabric;
use super::transport::tcp::TcpLoopback;
use super::*;

fn engine() -> Engine {
    Engine::new(EngineConfig { timeout: Duration::from_millis(500), ..Default::default() })
}

use super::expected_classification as expected;

fn every_fault_is_classified(t: &mut dyn ProbeTransport) {
    let mut e = engine();
    let pair = Pair::named(3, "mlx5_3");
    let other = Pair::named(4, "mlx5_4");
    for p in [&pair, &other] {
        let ok = e.probe(t, p, 1 << 20, None);
        assert_eq!(ok.result.verdict, ProbeVerdict::Ok, "{ok:?}");
        assert_eq!(ok.result.chunks, 16);
    }
    for kind in FaultKind::ALL {
        let out = e.probe(t, &pair, 1 << 20, Some(&Fault::new(kind)));
        let (verdict, diagnosis) = expected(kind);
        assert_eq!((out.result.verdict, out.result.diagnosis), (verdict, diagnosis), "{kind:?}: {out:#?}");
        // A clean probe right after: the path recovers, nothing lingers.
        assert_eq!(e.probe(t, &pair, 1 << 20, None).result.verdict, ProbeVerdict::Ok, "after {kind:?}");
    }
}

#[test]
fn every_fault_kind_is_classified_on_the_simulated_fabric() {
    every_fault_is_classified(&mut SimFabric);
}

#[test]
fn every_fault_kind_is_classified_over_real_tcp() {
    every_fault_is_classified(&mut TcpLoopback::new().unwrap());
}

#[test]
fn stale_bytes_identical_in_pattern_and_size_to_an_earlier_probe_are_caught() {
    let mut e = engine();
    let mut t = TcpLoopback::new().unwrap();
    let pair = Pair::named(0, "mlx5_0");
    let first = e.probe(&mut t, &pair, 4 << 20, None);
    assert_eq!(first.result.verdict, ProbeVerdict::Ok);
    let stale = e.probe(&mut t, &pair, 4 << 20, Some(&Fault::new(FaultKind::Stale)));
    assert_eq!(stale.result.verdict, ProbeVerdict::SilentCorruption);
    assert_eq!(stale.result.diagnosis, Diagnosis::Stale);
    assert_eq!(stale.receiver.bad_chunks, stale.receiver.chunks, "every chunk is the earlier probe's");
    assert!(stale.receiver.detail.contains("earlier probe #"), "{}", stale.receiver.detail);
    // What a weak check sees: right size, every byte from the same generator, no error.
    // ucx_perftest -V / nixlbench-style checks (one repeated byte per buffer) would pass
    // stale data of the same pattern; the nonce makes each probe's bytes its own.
    assert_eq!(stale.result.reported, Reported::Success);
}

#[test]
fn one_flipped_bit_in_the_last_byte_of_a_gibibyte_is_caught() {
    let mut e = engine();
    let gib = 1usize << 30;
    let out = e.probe(&mut SimFabric, &Pair::named(5, "mlx5_5"), gib, Some(&Fault::new(FaultKind::Bitflip)));
    assert_eq!(out.result.verdict, ProbeVerdict::SilentCorruption);
    assert_eq!(out.result.diagnosis, Diagnosis::Corrupt);
    assert_eq!(out.result.bad_chunks, 1);
    assert_eq!(out.result.chunks, (gib / pattern::DEFAULT_CHUNK_BYTES) as u32);
    assert_eq!(out.result.first_bad_offset, Some(gib as u64 - 1));
    assert_eq!(out.receiver.bit_flips, 1);
}

#[test]
fn two_swapped_chunks_are_caught_and_located() {
    let mut e = engine();
    let out = e.probe(
        &mut TcpLoopback::new().unwrap(),
        &Pair::named(1, "mlx5_1"),
        8 << 20,
        Some(&Fault::new(FaultKind::Swap)),
    );
    assert_eq!(out.result.verdict, ProbeVerdict::SilentCorruption);
    assert_eq!(out.result.diagnosis, Diagnosis::Swapped);
    assert_eq!(out.result.bad_chunks, 2);
    assert_eq!(out.result.first_bad_offset, Some(0));
    assert!(out.receiver.detail.contains("0←1") && out.receiver.detail.contains("1←0"), "{}", out.receiver.detail);
}

#[test]
fn a_reported_success_with_untouched_buffer_is_silent_corruption_not_ok() {
    // The seed incident in one line: the transport says success, the receive buffer still
    // holds the poison.
    let mut e = engine();
    let mut f = Fault::new(FaultKind::DmaReadRejected);
    f.reported = Some(Reported::Success);
    let out = e.probe(&mut SimFabric, &Pair::named(0, "mlx5_0"), 1 << 20, Some(&f));
    assert_eq!((out.result.verdict, out.result.diagnosis), (ProbeVerdict::SilentCorruption, Diagnosis::Untouched));
    assert!(out.result.simulated);
    f.reported = Some(Reported::Error);
    let out = e.probe(&mut SimFabric, &Pair::named(0, "mlx5_0"), 1 << 20, Some(&f));
    assert_eq!(out.result.verdict, ProbeVerdict::ReportedFailure);
}

#[test]
fn odd_sizes_work() {
    let mut e = engine();
    for bytes in [1usize, 7, 8, 65_537, 3 * 65_536 + 5] {
        let out = e.probe(&mut TcpLoopback::new().unwrap(), &Pair::named(0, "x"), bytes, None);
        assert_eq!(out.result.verdict, ProbeVerdict::Ok, "{bytes}");
        let out = e.probe(&mut SimFabric, &Pair::named(0, "x"), bytes, Some(&Fault::new(FaultKind::Bitflip)));
        assert_eq!(out.result.verdict, ProbeVerdict::SilentCorruption, "{bytes}");
    }
}

/// Real UCX (the system's libucp) over its tcp transport, pinned to loopback.
fn ucx_on_lo() -> super::transport::ucx::Ucx {
    use super::transport::ucx::{NicChoice, Ucx};
    Ucx::open(NicChoice::Pin("lo".into()), Some("tcp"))
        .expect("libucp with its tcp transport (apt-get install libucx0)")
}

#[test]
fn every_fault_kind_is_classified_over_real_ucx() {
    every_fault_is_classified(&mut ucx_on_lo());
}

#[test]
fn ucx_moves_large_buffers_intact() {
    let mut t = ucx_on_lo();
    let mut e = engine();
    let out = e.probe(&mut t, &Pair::named(0, "lo"), 64 << 20, None);
    assert_eq!(out.result.verdict, ProbeVerdict::Ok, "{out:?}");
    assert_eq!(out.result.transport, railguard_schema::Transport::Ucx);
}

/// UCX's own failure, for real: the receiving worker closed while a put is on its way. UCX
/// reports it (the endpoint has peer error handling), and the transport makes a new receiver,
/// so the next probe over the same transport is verified again.
#[test]
fn ucx_reports_a_peer_closed_mid_put_and_recovers() {
    let mut t = ucx_on_lo();
    let mut e = engine();
    let pair = Pair::named(0, "lo");
    let mode = super::transport::ProbeTransport::failure_modes(&t)[0];
    assert_eq!(mode.name, "peer_closed");
    for _ in 0..2 {
        let out = e.probe_failure(&mut t, &pair, 4 << 20, mode);
        assert_eq!(out.result.verdict, ProbeVerdict::ReportedFailure, "{out:?}");
        assert!(out.result.reported_detail.starts_with("ucp_"), "UCX's own words: {}", out.result.reported_detail);
        let out = e.probe(&mut t, &pair, 1 << 20, None);
        assert_eq!(out.result.verdict, ProbeVerdict::Ok, "the transport recovered: {out:?}");
    }
}

fn segmented(segment: usize) -> Engine {
    Engine::new(EngineConfig { timeout: Duration::from_millis(300), segment_bytes: segment, ..Default::default() })
}

#[test]
fn a_probe_larger_than_a_segment_moves_in_segments_and_reads_as_one() {
    let seg = 1 << 20;
    let mut e = segmented(seg);
    let pair = Pair::named(3, "mlx5_3");
    // Every fault is still classified as it is for one transfer, over real TCP, with the probe
    // five segments and a bit long (odd sizes included).
    let bytes = 5 * seg + 3 * 4096 + 5;
    let mut t = TcpLoopback::new().unwrap();
    let ok = e.probe(&mut t, &pair, bytes, None);
    assert_eq!(ok.result.verdict, ProbeVerdict::Ok, "{ok:?}");
    assert_eq!(ok.result.bytes, bytes as u64);
    assert_eq!(ok.result.chunks as usize, bytes.div_ceil(pattern::DEFAULT_CHUNK_BYTES));
    for kind in FaultKind::ALL {
        let out = e.probe(&mut t, &pair, bytes, Some(&Fault::new(kind)));
        assert_eq!((out.result.verdict, out.result.diagnosis), expected(kind), "{kind:?}: {out:#?}");
        // On a real transport the fault is an injection, whichever segment it went to (a bit
        // flip goes to the last): the probe is self-test history, not evidence.
        assert_eq!(out.result.injected, Injected::from(kind), "{kind:?}");
        assert_eq!(e.probe(&mut t, &pair, bytes, None).result.verdict, ProbeVerdict::Ok, "after {kind:?}");
    }
    // A rejected DMA read leaves every segment untouched: every chunk of the probe is bad.
    let out = e.probe(&mut SimFabric, &pair, 4 * seg, Some(&Fault::new(FaultKind::DmaReadRejected)));
    assert_eq!(out.result.bad_chunks, out.result.chunks);
    assert_eq!(out.result.first_bad_offset, Some(0));
    // The last byte's flip is located in the probe, not in its segment.
    let out = e.probe(&mut SimFabric, &pair, 4 * seg, Some(&Fault::new(FaultKind::Bitflip)));
    assert_eq!((out.result.bad_chunks, out.result.bit_flips), (1, 1));
    assert_eq!(out.result.first_bad_offset, Some(4 * seg as u64 - 1));
    assert!(out.result.receiver_detail.starts_with("segment 4 of 4"), "{}", out.result.receiver_detail);
    // A transport that never completes ends the probe at its first segment (no 4 × timeout).
    let started = Instant::now();
    let out = e.probe(&mut t, &pair, 4 * seg, Some(&Fault::new(FaultKind::Hang)));
    assert_eq!(out.result.verdict, ProbeVerdict::Timeout);
    assert_eq!(out.result.bytes, seg as u64, "only the first segment was tried");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}

#[test]
fn the_buffers_stay_the_size_of_a_segment() {
    let mut e = segmented(1 << 20);
    e.prepare(&Pair::named(0, "mlx5_0"), 64 << 20);
    assert_eq!(e.prepared.as_ref().map(|p| p.src.len() * 8), Some(1 << 20));
    let out = e.probe(&mut SimFabric, &Pair::named(0, "mlx5_0"), 64 << 20, None);
    assert_eq!(out.result.verdict, ProbeVerdict::Ok);
    assert_eq!(out.result.bytes, 64 << 20);
    assert!(e.spare.0.len() * 8 <= 1 << 20 && e.spare.1.len() * 8 <= 1 << 20);
    // Segments off: one transfer of the whole probe.
    let mut whole = segmented(0);
    whole.prepare(&Pair::named(0, "mlx5_0"), 4 << 20);
    assert_eq!(whole.prepared.as_ref().map(|p| p.src.len() * 8), Some(4 << 20));
}

#[test]
fn an_ok_probes_check_leaves_the_next_probes_poison_and_a_failed_one_does_not() {
    let mut e = engine();
    let pair = Pair::named(0, "mlx5_0");
    // One segment (the default is 1 MiB), its last chunk short.
    let bytes = (512 << 10) + 13;
    let poisoned = |e: &Engine| {
        let p = e.prepared.as_ref().expect("prepared");
        let mut want = vec![0u8; bytes];
        pattern::poison(p.poison_nonce, &mut want);
        (p.dst_poisoned, bytemuck::cast_slice::<u64, u8>(&p.dst)[..bytes] == want[..])
    };
    assert_eq!(e.probe(&mut SimFabric, &pair, bytes, None).result.verdict, ProbeVerdict::Ok);
    e.prepare(&pair, bytes);
    assert_eq!(poisoned(&e), (true, true), "the check wrote the next probe's poison; prepare kept it");
    // The kept poison is the one the receiver checks against: a drop reads as untouched.
    let dropped = e.probe(&mut SimFabric, &pair, bytes, Some(&Fault::new(FaultKind::Drop)));
    assert_eq!((dropped.result.diagnosis, dropped.receiver.bad_chunks), (Diagnosis::Untouched, 9));
    // A failed check leaves the bad chunks as they arrived: prepare poisons the whole buffer.
    let flipped = e.probe(&mut SimFabric, &pair, bytes, Some(&Fault::new(FaultKind::Bitflip)));
    assert_eq!(flipped.result.diagnosis, Diagnosis::Corrupt);
    assert!(e.spare_poison.is_none());
    e.prepare(&pair, bytes);
    assert_eq!(poisoned(&e), (true, true));
    // A shorter probe keeps the poison (one word repeated: the same over any length) ...
    assert_eq!(e.probe(&mut SimFabric, &pair, bytes, None).result.verdict, ProbeVerdict::Ok);
    e.prepare(&pair, 4096);
    assert!(e.prepared.as_ref().is_some_and(|p| p.dst_poisoned && p.bytes == 4096));
    assert_eq!(
        e.probe(&mut SimFabric, &pair, 4096, Some(&Fault::new(FaultKind::Drop))).result.diagnosis,
        Diagnosis::Untouched
    );
    // ... a longer one has its buffer poisoned again, over all of it.
    assert_eq!(e.probe(&mut SimFabric, &pair, 4096, None).result.verdict, ProbeVerdict::Ok);
    let short = e.spare_poison.expect("poisoned").nonce;
    e.prepare(&pair, bytes);
    assert!(e.prepared.as_ref().is_some_and(|p| p.poison_nonce != short && p.bytes == bytes));
    assert_eq!(poisoned(&e), (true, true));
    let dropped = e.probe(&mut SimFabric, &pair, bytes, Some(&Fault::new(FaultKind::Drop)));
    assert_eq!((dropped.result.diagnosis, dropped.receiver.bad_chunks), (Diagnosis::Untouched, 9));
}

#[test]
fn an_ok_probes_check_fills_the_next_probes_source_and_the_next_probe_uses_it() {
    let mut e = engine();
    let pair = Pair::named(0, "mlx5_0");
    let bytes = (512 << 10) + 13;
    let filled = |e: &Engine, bytes: usize| {
        let p = e.prepared.as_ref().expect("prepared");
        let mut want = vec![0u8; bytes];
        pattern::fill(p.nonce, 0, &mut want);
        (p.src_filled, bytemuck::cast_slice::<u64, u8>(&p.src)[..bytes] == want[..])
    };
    for fault in [None, Some(FaultKind::Bitflip), Some(FaultKind::Drop), Some(FaultKind::Stale)] {
        let f = fault.map(Fault::new);
        let out = e.probe(&mut SimFabric, &pair, bytes, f.as_ref());
        assert_eq!(out.result.verdict == ProbeVerdict::Ok, fault.is_none(), "{fault:?}");
        // Whatever the check found, the source holds a fresh nonce's pattern, and prepare keeps
        // it rather than filling again.
        let before = e.spare_fill.expect("the check filled the source");
        assert!(e.history.iter().all(|k| k.nonce != before.nonce), "a nonce no probe has carried");
        e.prepare(&pair, bytes);
        assert_eq!(e.prepared.as_ref().map(|p| p.nonce), Some(before.nonce), "{fault:?}");
        assert_eq!(filled(&e, bytes), (true, true), "{fault:?}");
        // The probe then carries that nonce, and its check passes.
        let next = e.probe(&mut SimFabric, &pair, bytes, None);
        assert_eq!(next.result.verdict, ProbeVerdict::Ok, "{fault:?}");
        assert_eq!(e.history.front().map(|k| k.nonce), Some(before.nonce));
    }
    // A shorter probe keeps the pattern (a prefix of it); a longer one gets a new nonce, filled.
    e.probe(&mut SimFabric, &pair, bytes, None);
    e.prepare(&pair, 4096);
    assert_eq!(filled(&e, 4096), (true, true));
    assert_eq!(e.probe(&mut SimFabric, &pair, 4096, None).result.verdict, ProbeVerdict::Ok);
    let short = e.spare_fill.expect("filled").nonce;
    e.prepare(&pair, bytes);
    assert!(e.prepared.as_ref().is_some_and(|p| p.nonce != short));
    assert_eq!(filled(&e, bytes), (true, true));
    assert_eq!(e.probe(&mut SimFabric, &pair, bytes, None).result.verdict, ProbeVerdict::Ok);
}

#[test]
fn a_segmented_probe_is_carried_by_its_weakest_segment() {
    use railguard_schema::{DataPath, Memory};
    assert_eq!(super::weaker_path(DataPath::NicDma, DataPath::HostCopy), DataPath::HostCopy);
    assert_eq!(super::weaker_path(DataPath::OtherDevice, DataPath::NicDma), DataPath::OtherDevice);
    assert_eq!(super::weaker_path(DataPath::NicDma, DataPath::NicDma), DataPath::NicDma);
    assert_eq!(super::weaker_memory(Memory::Cuda, Memory::Host), Memory::Host);
    assert_eq!(super::weaker_memory(Memory::CudaStaged, Memory::Cuda), Memory::CudaStaged);
}
