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
