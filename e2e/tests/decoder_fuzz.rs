//! Fuzzers of what comes from outside, 30,000 mutated inputs each, nothing panicking:
//! - the ingest decoder and validator (protobuf decoding, then `Record::try_from`, exactly what
//!   the collector runs on every record), topologies with gone GPUs among them: a refusal
//!   names what was wrong, and whatever is accepted encodes and decodes again;
//! - the agent's in-line line parser, results, engines and announcements;
//! - the HTTP side's `Host` allow-list.
//!
//! (The CLI's terminal forms of a hostile server's texts have theirs beside them, in the
//! collector's `cli/terminal.rs`.)
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use prost::Message;
use railguard_agent::topology::fixture;
use railguard_e2e::scripted::*;
use railguard_e2e::*;
use railguard_schema::*;
use rand::{Rng, SeedableRng};

fn seeds() -> Vec<Vec<u8>> {
    // A node whose GPU9 left the bus: the index it keeps is its own.
    let mut with_gone = topology(&fixture::seed_kvm_guest(), None);
    with_gone.gone.push(GoneGpu {
        index: 9,
        bdf: "0000:e1:00.0".parse().unwrap(),
        uuid: "GPU-9".into(),
        since_unix_s: 1,
    });
    let mut v: Vec<wire::Record> = vec![
        probe_rec(3, "mlx5_3", ProbeVerdict::SilentCorruption, PairSelection::Predicted, 5),
        topo_rec(topology(&fixture::seed_kvm_guest(), None)),
        topo_rec(with_gone),
    ];
    v.push(Record::now(RecordBody::Signal(signal(1))).into());
    // An in-line report naming its workload's pod.
    let at = convert::timestamp_to_unix_ns(chrono::Utc::now());
    let inline = wire::InlineReport {
        gpu_index: Some(3),
        nic: "mlx5_3".into(),
        pid: 7,
        process: "vllm".into(),
        memory: wire::Memory::Cuda.into(),
        path: wire::DataPath::NicDma.into(),
        attribution: "CUDA_VISIBLE_DEVICES=3".into(),
        transfers_ok: 5,
        first_at_unix_ns: at,
        last_at_unix_ns: at,
        pod: Some(wire::WorkloadPod {
            namespace: "serving".into(),
            name: "decode-3".into(),
            container: "vllm".into(),
            source: wire::PodSource::Kubelet.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    v.push(Record::now(RecordBody::Inline(InlineReport::try_from(inline).unwrap())).into());
    v.iter().map(Message::encode_to_vec).collect()
}

#[test]
fn mutated_records_never_panic_and_refusals_say_why() {
    let seeds = seeds();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (mut undecodable, mut refused, mut accepted, mut gone_kept, mut pods_kept) = (0, 0, 0, 0, 0);
    for _ in 0..30_000 {
        let mut b = seeds[rng.random_range(0..seeds.len())].clone();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..b.len());
            match rng.random_range(0..4) {
                0 => b[i] = rng.random(),
                1 => b[i] ^= 1 << rng.random_range(0..8),
                2 => {
                    b.remove(i);
                }
                _ => b.insert(i, rng.random()),
            }
            if b.is_empty() {
                break;
            }
        }
        let Ok(w) = wire::Record::decode(b.as_slice()) else {
            undecodable += 1;
            continue;
        };
        match Record::try_from(w) {
            Ok(r) => {
                accepted += 1;
                // No two GPUs of an accepted topology share an index, present or gone: blame
                // cannot move from one GPU to another by a number.
                if let RecordBody::Topology(t) = &r.body {
                    let mut indices: Vec<u32> =
                        t.gpus.iter().map(|g| g.index).chain(t.gone.iter().map(|g| g.index)).collect();
                    let n = indices.len();
                    indices.sort_unstable();
                    indices.dedup();
                    assert_eq!(indices.len(), n, "{:?} {:?}", t.gpus, t.gone);
                    gone_kept += usize::from(!t.gone.is_empty());
                }
                // An accepted pod is Kubernetes names and IDs alone: safe in a label, a URL, a
                // terminal.
                if let RecordBody::Inline(InlineReport { pod: Some(p), .. }) = &r.body {
                    let parts = [&p.namespace, &p.name, &p.container, &p.uid, &p.container_id];
                    let safe = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
                    assert!(parts.iter().all(|s| s.chars().all(safe)), "{p:?}");
                    pods_kept += 1;
                }
                // What is accepted is a well-formed record: it survives another round trip.
                let again: wire::Record = r.clone().into();
                assert_eq!(Record::try_from(again).unwrap(), r);
            }
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().trim().is_empty(), "a refusal without a reason");
            }
        }
    }
    // Each outcome was exercised, not just the decoder's failures.
    assert!(undecodable > 1000 && refused > 1000 && accepted > 1000, "{undecodable} {refused} {accepted}");
    assert!(gone_kept > 100, "topologies with a gone GPU were accepted too: {gone_kept}");
    assert!(pods_kept > 100, "in-line reports with a pod were accepted too: {pods_kept}");
}

/// The agent's in-line line parser (what a local process's bytes meet first) under 30,000
/// mutated messages: nothing panics, every refusal says why, and whatever is accepted is
/// within the bounds the agent promises (a GPU index below 64, bad blocks within the blocks).
#[test]
fn mutated_in_line_messages_never_panic_and_accepted_results_are_bounded() {
    use railguard_agent::inline::{MAX_RESULTS, MAX_SERVES, parse_line};
    let at = chrono::Utc::now().timestamp_nanos_opt().unwrap();
    let seeds: Vec<Vec<u8>> = [
        format!(
            r#"{{"v": 1, "results": [{{"device": 3, "memory": "vram", "request": "r1", "remote": "p0", "status": "mismatch", "blocks": 32, "bytes": 1048576, "bad_blocks": 2, "bad_block_indices": [4, 31], "first_bad_offset": 131072, "at_ns": {at}}}]}}"#
        ),
        format!(
            r#"{{"v": 1, "results": [{{"device": 0, "memory": "dram", "request": "r2", "status": "ok", "blocks": 8, "bytes": 4096, "at_ns": {at}}}, {{"device": 63, "memory": "vram", "request": "r3", "status": "error", "error": "NIXL_ERR_REMOTE_DISCONNECT", "blocks": 1, "bytes": 0, "at_ns": {at}}}]}}"#
        ),
        // A decode side's mismatch naming its source and what the bad blocks held, from a
        // named engine; a prefill side announcing the worker it serves as, and its source change.
        format!(
            r#"{{"v": 1, "engine": {{"name": "vllm", "version": "0.33.0", "connector": "RailguardNixlConnector", "settings": {{"enable_prefix_caching": "true"}}}}, "results": [{{"device": 1, "memory": "vram", "request": "d-1", "remote": "p|tp0pp0/7", "status": "mismatch", "blocks": 4, "bytes": 4096, "bad_blocks": 1, "bad_block_indices": [2], "diagnosis": {{"corrupt": 1}}, "source": {{"node": "node-b", "gpu": "0000:1b:00.0", "nic": "mlx5_3"}}, "at_ns": {at}}}]}}"#
        ),
        format!(
            r#"{{"v": 1, "serves": [{{"device": 3, "worker": "p|tp0pp0"}}], "results": [{{"device": 3, "memory": "vram", "request": "d-1", "remote": "p|tp0pp0/7", "status": "source_changed", "blocks": 4, "bytes": 4096, "bad_blocks": 1, "bad_block_indices": [2], "at_ns": {at}}}]}}"#
        ),
    ]
    .map(String::into_bytes)
    .to_vec();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (mut whole, mut some, mut accepted, mut announced) = (0, 0, 0, 0);
    for _ in 0..30_000 {
        let mut b = seeds[rng.random_range(0..seeds.len())].clone();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..b.len());
            match rng.random_range(0..5) {
                0 => b[i] = rng.random(),
                1 => b[i] = b"0123456789-9e+,\"{}[]"[rng.random_range(0..20)],
                2 => {
                    b.remove(i);
                }
                3 => b.insert(i, b'9'),
                _ => b.insert(i, rng.random()),
            }
            if b.is_empty() {
                break;
            }
        }
        match parse_line(&b, chrono::Utc::now()) {
            Err(e) => {
                whole += 1;
                assert!(!e.to_string().trim().is_empty());
            }
            Ok(railguard_agent::inline::Parsed { outcomes: ok, refused, engine, serves }) => {
                some += usize::from(!refused.is_empty());
                // What a process says of itself is bounded and printable too.
                announced += serves.len();
                for s in &serves {
                    assert!(s.device < railguard_schema::limits::MAX_GPUS_PER_NODE, "{s:?}");
                    assert!(!s.worker.is_empty() && !s.worker.chars().any(char::is_control), "{s:?}");
                }
                if let Some(e) = &engine {
                    assert!(!e.label().chars().any(char::is_control), "{e:?}");
                }
                assert!(ok.len() + refused.len() <= MAX_RESULTS + MAX_SERVES);
                for r in &refused {
                    let r = r.to_string();
                    assert!(r.starts_with("result ") || r.starts_with("serves "), "{r}");
                }
                for o in ok {
                    accepted += 1;
                    assert!(o.device < railguard_schema::limits::MAX_GPUS_PER_NODE, "{o:?}");
                    assert!(o.bad_blocks <= o.blocks && o.bad_block_indices.iter().all(|i| *i < o.blocks), "{o:?}");
                    assert!(!o.request.chars().any(char::is_control), "{o:?}");
                }
            }
        }
    }
    assert!(whole > 1000 && some > 1000 && accepted > 1000 && announced > 500, "{whole} {some} {accepted} {announced}");
}

/// The Host allow-list under 30,000 mutated names: nothing panics, and a name that is answered
/// is an IP literal, `localhost` or a listed name (with a port at most): never a name a page
/// could rebind.
#[test]
fn mutated_host_names_are_answered_only_as_addresses_or_listed_names() {
    use railguard_collector::http::host::AllowedHosts;
    use std::net::IpAddr;
    let listed = AllowedHosts::from_flags(&["Collector.Railguard.svc:7701".to_owned()]);
    let none = AllowedHosts::from_flags(&[]);
    let seeds = [
        "127.0.0.1:7701",
        "[::1]:7701",
        "::1",
        "localhost",
        "collector.railguard.svc:80",
        "[::1]evil.example",
        "evil.example",
    ];
    let alphabet: Vec<char> = "[]:.0123456789abcdefxlocalhost- \t\u{0}\u{e9}@/".chars().collect();
    // An independent reading: the name without one trailing `:digits` port and its brackets.
    let address_or = |host: &str, name: Option<&str>| {
        let t = host.trim();
        let bare_port = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        let no_port = match t.rsplit_once(':') {
            Some((n, p)) if bare_port(p) && (n.ends_with(']') || !n.contains(':')) => n,
            _ => t,
        };
        let unbracketed = |s: &str| s.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok();
        unbracketed(no_port)
            || unbracketed(t)
            || no_port.eq_ignore_ascii_case("localhost")
            || name.is_some_and(|n| no_port.eq_ignore_ascii_case(n))
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let (mut answered, mut refused) = (0, 0);
    for _ in 0..30_000 {
        let mut h: Vec<char> = seeds[rng.random_range(0..seeds.len())].chars().collect();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..h.len().max(1));
            match rng.random_range(0..3) {
                0 if !h.is_empty() => {
                    h.remove(i);
                }
                1 if !h.is_empty() => h[i] = alphabet[rng.random_range(0..alphabet.len())],
                _ => h.insert(i.min(h.len()), alphabet[rng.random_range(0..alphabet.len())]),
            }
        }
        let host: String = h.into_iter().collect();
        if none.allows(&host) {
            answered += 1;
            assert!(address_or(&host, None), "answered without being listed: {host:?}");
        } else {
            refused += 1;
        }
        if listed.allows(&host) {
            assert!(address_or(&host, Some("collector.railguard.svc")), "answered: {host:?}");
        }
    }
    assert!(answered > 1000 && refused > 1000, "{answered} {refused}");
}
