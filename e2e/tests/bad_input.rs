//! Hostile and broken requests: each gets a clear gRPC status, nothing of the batch is stored,
//! and the collector keeps serving.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes_codec::RawCodec;
use railguard_e2e::*;
use railguard_schema::wire::ingest_client::IngestClient;
use railguard_schema::wire::{self, RecordBatch, RegisterRequest};
use tonic::Code;
use tonic::transport::Channel;

mod bytes_codec {
    //! Sends arbitrary bytes as a gRPC message body.
    use tonic::Status;
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

    #[derive(Debug, Default, Clone)]
    pub struct RawCodec;
    #[derive(Debug)]
    pub struct RawEncoder;
    #[derive(Debug)]
    pub struct RawDecoder;

    impl Codec for RawCodec {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = RawEncoder;
        type Decoder = RawDecoder;
        fn encoder(&mut self) -> RawEncoder {
            RawEncoder
        }
        fn decoder(&mut self) -> RawDecoder {
            RawDecoder
        }
    }
    impl Encoder for RawEncoder {
        type Item = Vec<u8>;
        type Error = Status;
        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            use bytes::BufMut;
            dst.put_slice(&item);
            Ok(())
        }
    }
    impl Decoder for RawDecoder {
        type Item = Vec<u8>;
        type Error = Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
            use bytes::Buf;
            let mut v = vec![0; src.remaining()];
            src.copy_to_slice(&mut v);
            Ok(Some(v))
        }
    }
}

fn batch(node: &str, records: Vec<wire::Record>) -> RecordBatch {
    RecordBatch { node_id: node.into(), records, spool_dropped_total: 0, state: None }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_clear_errors_and_store_nothing() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let channel =
        Channel::from_shared(collector.url()).unwrap().timeout(Duration::from_secs(10)).connect().await.unwrap();
    let mut client = IngestClient::new(channel.clone()).max_encoding_message_size(64 << 20);

    // Garbage bytes where a RecordBatch should be.
    let mut raw = tonic::client::Grpc::new(channel.clone());
    raw.ready().await.unwrap();
    let garbage = vec![0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x99, 0x00, 0x01];
    let err = raw
        .unary::<Vec<u8>, Vec<u8>, _>(
            with_token(garbage, TOKEN_A),
            tonic::codegen::http::uri::PathAndQuery::from_static("/railguard.v1.Ingest/PushBatch"),
            RawCodec,
        )
        .await
        .unwrap_err();
    assert!(matches!(err.code(), Code::Internal | Code::InvalidArgument), "{err:?}");
    assert!(err.message().contains("decode"), "{err:?}");

    // No credential, a wrong credential.
    let err = client.push_batch(tonic::Request::new(batch("node-a", records(3)))).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = client.push_batch(with_token(batch("node-a", records(3)), "not-a-known-token-000")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");

    // node-b's credential writing as node-a; and registering as node-a.
    let err = client.push_batch(with_token(batch("node-a", records(3)), TOKEN_B)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("node-b"), "{err:?}");
    let reg = RegisterRequest { node_id: "node-a".into(), hostname: "x".into(), agent_version: "0".into() };
    assert_eq!(client.register(with_token(reg, TOKEN_B)).await.unwrap_err().code(), Code::PermissionDenied);

    // Oversize batch: one record over the limit.
    let over = railguard_schema::limits::MAX_BATCH_RECORDS as u64 + 1;
    let err = client.push_batch(with_token(batch("node-a", records(over)), TOKEN_A)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("limit"), "{err:?}");

    // Message larger than the transport limit.
    let mut huge = records(1);
    if let Some(wire::record::Body::Probe(p)) = huge[0].body.as_mut() {
        p.reported_detail = "x".repeat(20 << 20);
    }
    let err = client.push_batch(with_token(batch("node-a", huge), TOKEN_A)).await.unwrap_err();
    assert!(matches!(err.code(), Code::OutOfRange | Code::ResourceExhausted | Code::InvalidArgument), "{err:?}");

    // One invalid enum in the middle of an otherwise good batch: nothing of it is stored.
    let mut recs = records(100);
    if let Some(wire::record::Body::Probe(p)) = recs[50].body.as_mut() {
        p.verdict = 42;
    }
    let err = client.push_batch(with_token(batch("node-a", recs), TOKEN_A)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("record 50") && err.message().contains("probe verdict"), "{err:?}");

    // A single summary (agents from before summary sets): refused, naming the agent to run.
    let mut recs = records(3);
    let s = railguard_e2e::scripted::pair_summary(3, "mlx5_3", 4, chrono::Utc::now());
    recs[2].body = Some(wire::record::Body::Summary(s.into()));
    let err = client.push_batch(with_token(batch("node-a", recs), TOKEN_A)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let m = err.message();
    assert!(m.contains("record 2") && m.contains("`summary`") && m.contains("railguard-agent 0.1.0"), "{err:?}");

    // Empty id, impossible timestamp, NUL in text.
    let mut recs = records(3);
    recs[1].id.clear();
    let err = client.push_batch(with_token(batch("node-a", recs), TOKEN_A)).await.unwrap_err();
    assert!(err.message().contains("id is empty"), "{err:?}");
    let mut recs = records(3);
    recs[2].observed_at_unix_ns = -5;
    let err = client.push_batch(with_token(batch("node-a", recs), TOKEN_A)).await.unwrap_err();
    assert!(err.message().contains("before 2000-01-01"), "{err:?}");
    let mut recs = records(3);
    if let Some(wire::record::Body::Probe(p)) = recs[0].body.as_mut() {
        p.reported_detail = "detail\0".into();
    }
    let err = client.push_batch(with_token(batch("node-a", recs), TOKEN_A)).await.unwrap_err();
    assert!(err.message().contains("NUL"), "{err:?}");

    assert_eq!(pg.stored_and_distinct().await, (0, 0), "nothing of a refused batch is stored");

    // The collector still serves good requests.
    let ack = client.push_batch(with_token(batch("node-a", records(10)), TOKEN_A)).await.unwrap().into_inner();
    assert_eq!((ack.stored, ack.duplicates), (10, 0));
    assert_eq!(pg.stored_and_distinct().await, (10, 10));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_record_in_the_spool_is_isolated_and_the_rest_delivered() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let mut recs = records(500);
    if let Some(wire::record::Body::Probe(p)) = recs[321].body.as_mut() {
        p.transport = 99; // e.g. written by a newer agent the collector does not know yet
    }
    let (spool_dir, token) = spool_of(dir.path(), &recs);
    let mut agent = agent_ship(&collector.url(), &spool_dir, &token, 100);
    assert!(wait_exit(&mut agent, Duration::from_secs(60)).success());
    assert_eq!(pg.stored_and_distinct().await, (499, 499));
    let rejected = std::fs::read_to_string(spool_dir.join("rejected.jsonl")).unwrap();
    assert_eq!(rejected.lines().count(), 1);
    assert!(rejected.contains("transport"), "{rejected}");
}
