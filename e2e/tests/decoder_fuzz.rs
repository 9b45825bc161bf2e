//! The ingest decoder and validator (protobuf decoding, then `Record::try_from`, exactly what
//! the collector runs on every record) under 30,000 mutated records of every kind: nothing
//! panics, a refusal names what was wrong, and whatever is accepted encodes and decodes again.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use prost::Message;
use railguard_agent::topology::fixture;
use railguard_e2e::scripted::*;
use railguard_e2e::*;
use railguard_schema::*;
use rand::{Rng, SeedableRng};

fn seeds() -> Vec<Vec<u8>> {
    let mut v: Vec<wire::Record> = vec![
        probe_rec(3, "mlx5_3", ProbeVerdict::SilentCorruption, PairSelection::Predicted, 5),
        topo_rec(topology(&fixture::seed_kvm_guest(), None)),
    ];
    v.push(Record::now(RecordBody::Signal(signal(1))).into());
    v.iter().map(Message::encode_to_vec).collect()
}

#[test]
fn mutated_records_never_panic_and_refusals_say_why() {
    let seeds = seeds();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (mut undecodable, mut refused, mut accepted) = (0, 0, 0);
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
}

/// The agent's in-line line parser (what a local process's bytes meet first) under 30,000
/// mutated messages: nothing panics, every refusal says why, and whatever is accepted is
/// within the bounds the agent promises (a GPU index below 64, bad blocks within the blocks).
#[test]
fn mutated_in_line_messages_never_panic_and_accepted_results_are_bounded() {
    use railguard_agent::inline::{MAX_RESULTS, parse_line};
    let at = chrono::Utc::now().timestamp_nanos_opt().unwrap();
    let seeds: Vec<Vec<u8>> = [
        format!(
            r#"{{"v": 1, "results": [{{"device": 3, "memory": "vram", "request": "r1", "remote": "p0", "status": "mismatch", "blocks": 32, "bytes": 1048576, "bad_blocks": 2, "bad_block_indices": [4, 31], "first_bad_offset": 131072, "at_ns": {at}}}]}}"#
        ),
        format!(
            r#"{{"v": 1, "results": [{{"device": 0, "memory": "dram", "request": "r2", "status": "ok", "blocks": 8, "bytes": 4096, "at_ns": {at}}}, {{"device": 63, "memory": "vram", "request": "r3", "status": "error", "error": "NIXL_ERR_REMOTE_DISCONNECT", "blocks": 1, "bytes": 0, "at_ns": {at}}}]}}"#
        ),
    ]
    .map(String::into_bytes)
    .to_vec();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (mut whole, mut some, mut accepted) = (0, 0, 0);
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
            Ok(railguard_agent::inline::Parsed { outcomes: ok, refused, .. }) => {
                some += usize::from(!refused.is_empty());
                assert!(ok.len() + refused.len() <= MAX_RESULTS);
                for r in &refused {
                    assert!(r.to_string().starts_with("result "), "{r}");
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
    assert!(whole > 1000 && some > 1000 && accepted > 1000, "{whole} {some} {accepted}");
}
