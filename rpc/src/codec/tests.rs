//! Tests of `BytesCodec`, alone and over real gRPC: messages larger than many HTTP/2
//! frames, streams of many messages, compressed with zstd and gzip or not, decode to
//! exactly what was sent, on both the server (requests) and the client (responses); a
//! damaged message fails with the status tonic_prost gave.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use prost::Message;
use prost::bytes::{BufMut, Bytes};
use tonic::codec::{Codec, CompressionEncoding, EncodeBuf, Encoder};
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

use crate::proto::v1;
use v1::collector_client::CollectorClient;
use v1::collector_server::{Collector, CollectorServer};
use v1::peer_client::PeerClient;
use v1::peer_server::{Peer, PeerServer};

const LIMIT: usize = 64 << 20;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `n` bytes, half random, half compressible.
fn data(state: &mut u64, n: usize) -> Bytes {
    (0..n)
        .map(|i| {
            if i % 2 == 0 {
                splitmix(state) as u8
            } else {
                (i % 7) as u8
            }
        })
        .collect::<Vec<u8>>()
        .into()
}

fn series(i: usize) -> v1::Series {
    v1::Series {
        metric: format!("metric.{i}"),
        tags: vec![v1::Tag {
            key: "region".into(),
            value: format!("é-{i}"),
        }],
    }
}

fn push_request(state: &mut u64, snapshots: usize, each: usize) -> v1::PushRequest {
    v1::PushRequest {
        server: Some(v1::Server {
            name: "web-1".into(),
            labels: vec![],
        }),
        snapshots: (0..snapshots)
            .map(|i| v1::Snapshot {
                series: Some(series(i)),
                hour: 490_000 + i as u32,
                epoch: 7,
                version: (i as u64) << 40 | 1,
                sketch: Some(v1::EncodedSketch {
                    kind: 1 + (i % 3) as i32,
                    data: data(state, each + i * 13),
                }),
            })
            .collect(),
        live_hours: (0..(snapshots as u32 * 3)).collect(),
    }
}

#[derive(Default)]
struct Echo {
    received: Mutex<Vec<v1::PushRequest>>,
    chunks: Mutex<Vec<v1::CopyChunk>>,
}

#[tonic::async_trait]
impl Collector for Arc<Echo> {
    async fn push(
        &self,
        request: Request<v1::PushRequest>,
    ) -> Result<Response<v1::PushResponse>, Status> {
        let request = request.into_inner();
        // A large response: one result per snapshot, each naming a long reason.
        let results = request
            .snapshots
            .iter()
            .map(|s| v1::SnapshotResult {
                outcome: 1,
                held_version: s.version,
                reason: format!("{:?}", s.sketch.as_ref().map(|k| k.data.len())).repeat(200),
            })
            .collect();
        self.received.lock().unwrap().push(request);
        Ok(Response::new(v1::PushResponse { results }))
    }
}

#[tonic::async_trait]
impl Peer for Arc<Echo> {
    async fn partial(
        &self,
        _: Request<v1::PartialRequest>,
    ) -> Result<Response<v1::PartialResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn held(
        &self,
        _: Request<v1::HeldRequest>,
    ) -> Result<Response<v1::HeldResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn status(
        &self,
        _: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
    type CopyStream = tokio_stream::Iter<std::vec::IntoIter<Result<v1::CopyChunk, Status>>>;
    async fn copy(
        &self,
        _: Request<v1::CopyRequest>,
    ) -> Result<Response<Self::CopyStream>, Status> {
        let chunks: Vec<Result<v1::CopyChunk, Status>> = self
            .chunks
            .lock()
            .unwrap()
            .iter()
            .cloned()
            .map(Ok)
            .collect();
        Ok(Response::new(tokio_stream::iter(chunks)))
    }
}

/// A server of Collector and Peer on a free port, accepting and sending `compression`.
async fn serve(echo: Arc<Echo>, compression: Option<CompressionEncoding>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut collector = CollectorServer::new(Arc::clone(&echo))
        .max_decoding_message_size(LIMIT)
        .max_encoding_message_size(LIMIT)
        .accept_compressed(CompressionEncoding::Zstd)
        .accept_compressed(CompressionEncoding::Gzip);
    let mut peer = PeerServer::new(echo)
        .max_decoding_message_size(LIMIT)
        .max_encoding_message_size(LIMIT)
        .accept_compressed(CompressionEncoding::Zstd)
        .accept_compressed(CompressionEncoding::Gzip);
    if let Some(c) = compression {
        collector = collector.send_compressed(c);
        peer = peer.send_compressed(c);
    }
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        Server::builder()
            .add_service(collector)
            .add_service(peer)
            .serve_with_incoming(incoming),
    );
    addr
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

const COMPRESSIONS: [Option<CompressionEncoding>; 3] = [
    None,
    Some(CompressionEncoding::Zstd),
    Some(CompressionEncoding::Gzip),
];

/// Pushes of one large request (MiBs: hundreds of HTTP/2 DATA frames) and of small ones,
/// each way compressed or not: the server decodes exactly the request, the client
/// exactly the response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_small_pushes_decode_exactly_compressed_or_not() {
    let mut state = 1;
    for compression in COMPRESSIONS {
        let echo = Arc::new(Echo::default());
        let addr = serve(Arc::clone(&echo), compression).await;
        let mut client = CollectorClient::new(channel(addr).await)
            .max_decoding_message_size(LIMIT)
            .max_encoding_message_size(LIMIT)
            .accept_compressed(CompressionEncoding::Zstd)
            .accept_compressed(CompressionEncoding::Gzip);
        if let Some(c) = compression {
            client = client.send_compressed(c);
        }
        let requests = [
            push_request(&mut state, 600, 5000), // ~3 MiB
            push_request(&mut state, 1, 10),
            v1::PushRequest::default(), // an empty message: zero bytes
            push_request(&mut state, 3, 70_000),
        ];
        for (n, request) in requests.iter().enumerate() {
            let response = client
                .push(request.clone())
                .await
                .unwrap_or_else(|e| panic!("{compression:?} #{n}: {e}"))
                .into_inner();
            let received = echo.received.lock().unwrap().last().cloned().unwrap();
            assert!(
                received == *request,
                "{compression:?} #{n}: the server decoded another request"
            );
            assert_eq!(response.results.len(), request.snapshots.len());
            for (r, s) in response.results.iter().zip(&request.snapshots) {
                assert_eq!(r.held_version, s.version);
                assert_eq!(
                    r.reason,
                    format!("{:?}", s.sketch.as_ref().map(|k| k.data.len())).repeat(200)
                );
            }
        }
    }
}

/// A server stream of many messages of mixed sizes (several in one DATA frame, one over
/// many): each decodes to the message sent, and the bytes of earlier messages stay
/// intact while later ones are received into the same buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_messages_decode_exactly_and_stay_intact() {
    let mut state = 2;
    for compression in COMPRESSIONS {
        let echo = Arc::new(Echo::default());
        let chunks: Vec<v1::CopyChunk> = (0..40)
            .map(|i| v1::CopyChunk {
                applied: [(i as u32, i as u64 * 3)].into_iter().collect(),
                servers: vec![],
                rows: (0..(i % 5) + 1)
                    .map(|r| v1::CopiedRow {
                        series: Some(series(r)),
                        kind: 1,
                        hour: 490_000,
                        server: format!("s{i}"),
                        epoch: 1,
                        version: r as u64,
                        sketch: data(
                            &mut state,
                            match i % 4 {
                                0 => 3,
                                1 => 200,
                                2 => 40_000,
                                _ => 300_000,
                            },
                        ),
                    })
                    .collect(),
                days: vec![],
                done: i == 39,
            })
            .collect();
        *echo.chunks.lock().unwrap() = chunks.clone();
        let addr = serve(Arc::clone(&echo), compression).await;
        let mut client = PeerClient::new(channel(addr).await)
            .max_decoding_message_size(LIMIT)
            .accept_compressed(CompressionEncoding::Zstd)
            .accept_compressed(CompressionEncoding::Gzip);
        let mut stream = client
            .copy(v1::CopyRequest::default())
            .await
            .unwrap()
            .into_inner();
        let mut got = Vec::new();
        while let Some(chunk) = stream.message().await.unwrap() {
            got.push(chunk);
        }
        assert_eq!(got.len(), chunks.len(), "{compression:?}");
        for (i, (g, c)) in got.iter().zip(&chunks).enumerate() {
            assert!(g == c, "{compression:?}: chunk {i} decoded differently");
        }
    }
}

/// Sends raw bytes as a request message, to see how the server decodes a damaged one.
#[derive(Default, Clone)]
struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

#[derive(Default, Clone)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = v1::PushResponse;
    type Encoder = RawEncoder;
    type Decoder = tonic_prost::ProstDecoder<v1::PushResponse>;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

/// A damaged request fails with INTERNAL and prost's message, as tonic_prost did; a
/// valid one sent as raw bytes decodes as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_request_fails_as_tonic_prost_did() {
    let mut state = 3;
    let echo = Arc::new(Echo::default());
    let addr = serve(Arc::clone(&echo), None).await;
    let request = push_request(&mut state, 20, 1000);
    let wire = Bytes::from(request.encode_to_vec());
    let bad_utf8 = {
        // A Server whose name is not UTF-8.
        let mut b = vec![0x0a, 0x04, 0x0a, 0x02, 0xff, 0xfe];
        b.extend_from_slice(&wire);
        Bytes::from(b)
    };
    let cases = [
        wire.slice(..wire.len() - 3),      // truncated inside a field
        Bytes::from_static(&[0x12, 0xff]), // a length that runs past the end
        Bytes::from_static(&[0x08]),       // a varint cut short
        bad_utf8,
        Bytes::from_static(&[0x07, 0x00]), // wire type 7
    ];
    for (n, bad) in cases.iter().enumerate() {
        let expected = v1::PushRequest::decode(bad.clone())
            .unwrap_err()
            .to_string();
        let mut grpc = tonic::client::Grpc::new(channel(addr).await);
        grpc.ready().await.unwrap();
        let path =
            tonic::codegen::http::uri::PathAndQuery::from_static("/hourglass.v1.Collector/Push");
        let status = grpc
            .unary(Request::new(bad.clone()), path, RawCodec)
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal, "case {n}: {status:?}");
        assert_eq!(status.message(), expected, "case {n}");
    }
    // And the valid message through the same path.
    let mut grpc = tonic::client::Grpc::new(channel(addr).await);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/hourglass.v1.Collector/Push");
    grpc.unary(Request::new(wire), path, RawCodec)
        .await
        .unwrap();
    assert!(echo.received.lock().unwrap().last().unwrap() == &request);
}

/// The decoder alone, on one message as prost reads it from tonic's buffer and as
/// BytesDecoder reads it: the same message or the same error, for a message and every
/// prefix of it.
#[test]
fn decoder_matches_prost_on_every_prefix() {
    let mut state = 4;
    let request = push_request(&mut state, 4, 30);
    let wire = request.encode_to_vec();
    for end in 0..=wire.len() {
        let part = Bytes::copy_from_slice(&wire[..end]);
        let by_bytes = v1::PushRequest::decode(part.clone()).map_err(|e| e.to_string());
        let by_slice = v1::PushRequest::decode(&wire[..end]).map_err(|e| e.to_string());
        assert_eq!(by_bytes, by_slice, "prefix of {end} bytes");
    }
}

/// What the decoder hands prost (the message as `Bytes`) decodes to the message sent,
/// its `packed_items` a slice of the received bytes rather than a copy; a damaged
/// message fails as prost says. (Every gRPC test decodes through the codec itself.)
#[test]
fn a_message_as_bytes_decodes_in_place() {
    let request = v1::IngestRequest {
        events: vec![v1::Event {
            metric: "m".into(),
            item: Bytes::from_static(b"x"),
            time_unix_seconds: 1_764_000_000,
            ..Default::default()
        }],
        batches: vec![v1::SeriesBatch {
            metric: "visitors".into(),
            packed_items: crate::packed::pack([&b"a"[..], b"bc"]).into(),
            times_unix_seconds: vec![1_764_000_000, 1_764_000_001],
            ..Default::default()
        }],
    };
    let wire = Bytes::from(request.encode_to_vec());
    let decoded = v1::IngestRequest::decode(wire.clone()).unwrap();
    assert_eq!(decoded, request);
    let items = decoded.batches[0].packed_items.as_ptr_range();
    let received = wire.as_ptr_range();
    assert!(received.start <= items.start && items.end <= received.end);
    let damaged = wire.slice(..wire.len() - 3);
    assert!(v1::IngestRequest::decode(damaged).is_err());
}
