//! Probe engine throughput on one core, in one run:
//! - verification (every byte of the received buffer against the pattern made again from the
//!   nonce) against a plain memcpy of the same buffer (goal ≥ 0.8×), with the digests it
//!   replaced as the check (CRC32, and XXH3-64 that was not chosen) beside it;
//! - a whole 64 MiB probe over TCP loopback (fill, poison, transfer, verify) against a raw
//!   socket copy of 64 MiB (goal ≥ 0.7×).
//!
//! Run: `cargo bench -p railguard-agent --bench verify`.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use railguard_agent::probe::transport::sim::SimFabric;
use railguard_agent::probe::transport::tcp::TcpLoopback;
use railguard_agent::probe::{Engine, EngineConfig, Pair, pattern, verify};

fn best_of<F: FnMut()>(n: usize, mut f: F) -> Duration {
    (0..n)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .min()
        .unwrap()
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn main() {
    let size = 256 << 20;
    let chunk = pattern::DEFAULT_CHUNK_BYTES;
    let mut src = vec![0u8; size];
    let mut dst = vec![0u8; size];
    pattern::fill(42, 0, &mut src);
    dst.copy_from_slice(&src);
    let probe = verify::KnownProbe::new(0, "p".to_owned(), 42, size, chunk);

    let memcpy = best_of(7, || {
        dst.copy_from_slice(std::hint::black_box(&src));
    });
    let verify_t = best_of(7, || {
        let v = verify::verify(std::hint::black_box(&dst), &probe, 7, &[]);
        assert!(v.ok());
    });
    let crc = best_of(7, || {
        std::hint::black_box(pattern::digests(std::hint::black_box(&dst), chunk));
    });
    let xxh3 = best_of(7, || {
        let d: Vec<u64> = dst.chunks(chunk).map(xxhash_rust::xxh3::xxh3_64).collect();
        std::hint::black_box(d);
    });
    let mut words = vec![0u64; size / 8];
    let fill = best_of(5, || {
        pattern::fill_words(std::hint::black_box(43), 0, &mut words);
        std::hint::black_box(&words);
    });

    println!("verify benchmark (one core, {} MiB buffer, {} KiB chunks)", size >> 20, chunk >> 10);
    println!("  memcpy            {:>6.2} GB/s", gbps(size, memcpy));
    println!(
        "  verify (compare)  {:>6.2} GB/s   ratio to memcpy {:.2} (goal >= 0.8)",
        gbps(size, verify_t),
        memcpy.as_secs_f64() / verify_t.as_secs_f64()
    );
    println!(
        "  digest CRC32      {:>6.2} GB/s   (the check before the compare; now only for bad chunks)",
        gbps(size, crc)
    );
    println!("  digest XXH3-64    {:>6.2} GB/s   (candidate not chosen)", gbps(size, xxh3));
    println!(
        "  fill              {:>6.2} GB/s   (sender side, off the probe's critical path when prepared)",
        gbps(size, fill)
    );

    // 64 MiB probe over TCP loopback vs a raw socket copy of 64 MiB.
    let probe_bytes = 64 << 20;
    let mut t = TcpLoopback::new().unwrap();
    let mut engine = Engine::new(EngineConfig::default());
    let pair = Pair::named(0, "lo");
    engine.probe(&mut t, &pair, probe_bytes, None);
    let probe = best_of(7, || {
        let out = engine.probe(&mut t, &pair, probe_bytes, None);
        assert_eq!(out.result.verdict, railguard_schema::ProbeVerdict::Ok);
    });
    // As the probe loop runs it: buffers prepared while waiting for the slot.
    let mut prepared = Duration::MAX;
    for _ in 0..7 {
        engine.prepare(&pair, probe_bytes);
        let s = Instant::now();
        let out = engine.probe(&mut t, &pair, probe_bytes, None);
        prepared = prepared.min(s.elapsed());
        assert_eq!(out.result.verdict, railguard_schema::ProbeVerdict::Ok);
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut tx = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    tx.set_nodelay(true).unwrap();
    let (mut rx, _) = listener.accept().unwrap();
    let payload = vec![7u8; probe_bytes];
    let mut sink = vec![0u8; probe_bytes];
    let raw = best_of(7, || {
        std::thread::scope(|s| {
            let r = s.spawn(|| rx.read_exact(&mut sink).unwrap());
            tx.write_all(&payload).unwrap();
            r.join().unwrap();
        });
    });
    println!("probe benchmark (64 MiB over TCP loopback)");
    println!("  raw socket copy   {:>6.2} GB/s", gbps(probe_bytes, raw));
    println!(
        "  probe, prepared   {:>6.2} GB/s   ratio to raw copy {:.2} (goal >= 0.7; transfer + receiver's check)",
        gbps(probe_bytes, prepared),
        raw.as_secs_f64() / prepared.as_secs_f64()
    );
    println!(
        "  probe, cold       {:>6.2} GB/s   ratio to raw copy {:.2} (fill and poison included)",
        gbps(probe_bytes, probe),
        raw.as_secs_f64() / probe.as_secs_f64()
    );

    // The whole host data path of a 64 MiB probe on the simulated fabric (fill, the fabric's
    // copy, compare and the next poison), by segment size: what one probe costs the agent's
    // core, and where the segment's two buffers stop fitting the core's caches.
    println!("probe data path on the simulated fabric (64 MiB probe, host memory, one core)");
    for seg in [256usize << 10, 1 << 20, 2 << 20, 8 << 20] {
        let cfg = EngineConfig { segment_bytes: seg, ..EngineConfig::default() };
        let mut engine = Engine::new(cfg);
        let mut fabric = SimFabric;
        engine.probe(&mut fabric, &pair, probe_bytes, None);
        let t = best_of(7, || {
            let out = engine.probe(&mut fabric, &pair, probe_bytes, None);
            assert_eq!(out.result.verdict, railguard_schema::ProbeVerdict::Ok);
        });
        // 88 probes a minute of 64 MiB (the default cadence): the share of one core.
        let share = 100.0 * t.as_secs_f64() * 88.0 / 60.0;
        println!(
            "  segments of {:>5} KiB  {:>6.2} GB/s   {:.2} % of a core at 88 probes a minute",
            seg >> 10,
            gbps(probe_bytes, t),
            share
        );
    }

    // The same at the default segment, by the width of the pattern loops (fill, compare, poison;
    // the fabric's copy is libc's memcpy at every width): what AVX2 buys.
    println!(
        "probe data path by loop width ({} KiB segments; the CPU's widest: {:?})",
        EngineConfig::DEFAULT_SEGMENT_BYTES >> 10,
        pattern::simd::detected()
    );
    let widths = [pattern::simd::Level::Baseline, pattern::simd::Level::Avx2];
    let mut engine = Engine::new(EngineConfig::default());
    let mut fabric = SimFabric;
    for level in widths.into_iter().filter(|l| *l <= pattern::simd::detected()) {
        let before = pattern::simd::cap(level);
        engine.probe(&mut fabric, &pair, probe_bytes, None);
        let t = best_of(7, || {
            let out = engine.probe(&mut fabric, &pair, probe_bytes, None);
            assert_eq!(out.result.verdict, railguard_schema::ProbeVerdict::Ok);
        });
        pattern::simd::cap(before);
        println!(
            "  {:<8}  {:>6.2} GB/s   {:.2} % of a core at 88 probes a minute",
            format!("{level:?}"),
            gbps(probe_bytes, t),
            100.0 * t.as_secs_f64() * 88.0 / 60.0
        );
    }
}
