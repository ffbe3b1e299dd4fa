//! `SeriesBatch.packed_items` at the agent's `Ingest.Send`: a packed batch
//! is the same events as the `items` batch, refused events are numbered across events and
//! batches, every event is either accepted or counted refused, and a malformed packed
//! field refuses its batch.

use std::sync::{Arc, Mutex};

use hourglass_rpc::packed;
use hourglass_rpc::proto::v1;
use hourglass_rpc::proto::v1::ingest_server::Ingest;
use hourglass_rpc::time::unix_now;
use tonic::Request;

use super::testing::{self, send, sketches};
use crate::config::Config;
use crate::ingest::IngestService;
use crate::table::Table;

fn service(config: Config) -> (IngestService, Arc<Mutex<Table>>) {
    testing::service(&config, None)
}

fn batch(metric: &str) -> v1::SeriesBatch {
    v1::SeriesBatch {
        metric: metric.to_string(),
        ..Default::default()
    }
}

fn event(metric: &str, item: &[u8]) -> v1::Event {
    v1::Event {
        metric: metric.to_string(),
        item: item.to_vec().into(),
        ..Default::default()
    }
}

fn listed(reply: &v1::IngestResponse) -> Vec<u32> {
    reply.rejected_events.iter().map(|r| r.index).collect()
}

/// A packed batch is the same events as an `items` batch: the same reply (indexes and
/// reasons included) and the same sketches, with per-item times and weights, an empty
/// item and an item over `max_item_len`.
#[tokio::test]
async fn a_packed_batch_is_the_items_batch() {
    let now = unix_now();
    let hour = (now / 3600) as u32;
    let long = vec![b'x'; 100_000];
    let items: Vec<&[u8]> = vec![b"a", b"", b"b", &long, b"a", b"c"];
    let times = vec![now, now - 3600, 0, now, now - 3600, now];
    let weights = vec![1, 2, 3, 4, 5, 0];
    let (by_items, items_table) = service(Config::default());
    let (by_packed, packed_table) = service(Config::default());
    let mut plain = batch("m");
    plain.items = items.iter().collect();
    plain.times_unix_seconds = times.clone();
    plain.weights = weights.clone();
    let mut packed_batch = batch("m");
    packed_batch.packed_items = packed::pack(items.iter().copied()).into();
    packed_batch.times_unix_seconds = times;
    packed_batch.weights = weights;
    let events = vec![event("m", b"e0"), event("m", b"")];
    let a = send(
        &by_items,
        v1::IngestRequest {
            events: events.clone(),
            batches: vec![plain.clone(), plain],
        },
    )
    .await;
    let b = send(
        &by_packed,
        v1::IngestRequest {
            events,
            batches: vec![packed_batch.clone(), packed_batch],
        },
    )
    .await;
    assert_eq!(a, b);
    // 2 events + 2 × 6 items; refused: event 1 (empty), items 1 and 3 of each batch.
    assert_eq!((b.accepted, b.rejected), (14 - 5, 5));
    assert_eq!(listed(&b), vec![1, 3, 5, 9, 11]);
    let hours = [hour - 1, hour];
    assert_eq!(
        sketches(&items_table, "m", &hours),
        sketches(&packed_table, "m", &hours)
    );
}

/// Refused events are numbered across events and batches, whatever the batch's form; a
/// faulty packed field refuses its events up to and including the cut item, and later
/// batches are numbered after them; every event is accepted or counted refused.
#[tokio::test]
async fn refused_indexes_number_across_events_and_batches() {
    let (service, _) = service(Config::default());
    // Cut inside the length of item 2 (a varint continuation byte at the end).
    let mut cut_in_length = packed::pack([&b"p"[..], b"q"]);
    cut_in_length.push(0x80);
    // Cut exactly after the length of item 1: its bytes are missing.
    let mut cut_after_length = packed::pack([&b"r"[..]]);
    cut_after_length.push(3);
    // Both fields: refused whole.
    let mut both = batch("m");
    both.items = [b"s"].into_iter().collect();
    both.packed_items = packed::pack([&b"t"[..], b"u"]).into();
    let mut good = batch("m");
    good.packed_items = packed::pack([&b"v"[..], b"", b"w"]).into();
    let mut cut1 = batch("m");
    cut1.packed_items = cut_in_length.into();
    let mut cut2 = batch("m");
    cut2.packed_items = cut_after_length.into();
    let mut plain = batch("m");
    plain.items = [&b"x"[..], b""].into_iter().collect();
    let reply = send(
        &service,
        v1::IngestRequest {
            events: vec![event("m", b"e0"), event("m", b"")],
            // Indexes: events 0-1; good 2-4; cut1 5-7; cut2 8-9; both 10-12; plain 13-14.
            batches: vec![good, cut1, cut2, both, plain],
        },
    )
    .await;
    assert_eq!(
        listed(&reply),
        vec![1, 3, 5, 6, 7, 8, 9, 10, 11, 12, 14],
        "{reply:?}"
    );
    assert_eq!(reply.accepted + reply.rejected, 15);
    assert_eq!(reply.accepted, 4);
}

/// `limits.max_events_per_request` counts packed items: a request one over is refused
/// whole, one at the limit is taken.
#[tokio::test]
async fn max_events_per_request_counts_packed_items() {
    let mut config = Config::default();
    config.limits.max_events_per_request = 4;
    let (service, _) = service(config);
    let mut four = batch("m");
    four.packed_items = packed::pack([&b"a"[..], b"b", b"c", b"d"]).into();
    let reply = send(
        &service,
        v1::IngestRequest {
            events: vec![],
            batches: vec![four.clone()],
        },
    )
    .await;
    assert_eq!(reply.accepted, 4);
    let over = service
        .send(Request::new(v1::IngestRequest {
            events: vec![event("m", b"e")],
            batches: vec![four],
        }))
        .await;
    assert_eq!(over.unwrap_err().code(), tonic::Code::ResourceExhausted);
}

/// A length varint of ten bytes whose last byte carries bits above 2^64 is not a length
/// any writer makes (`packed::push` never does, and protobuf's own varints refuse it); it
/// must be a fault of the field, not silently read as the length its low 64 bits give.
/// Here `0x81, 0x80 × 8, 0x02` is 1 + 2^64, read as 1, so the batch's item `z` is
/// accepted from a malformed field.
#[tokio::test]
async fn an_overlong_varint_length_refuses_its_batch() {
    let mut field = vec![0x81];
    field.extend([0x80; 8]);
    field.push(0x02);
    field.push(b'z');
    assert!(
        packed::count(&field).is_err(),
        "a 10-byte varint above u64::MAX read as length {:?}",
        packed::unpack(&field).next()
    );
    let (service, _) = service(Config::default());
    let mut b = batch("m");
    b.packed_items = field.into();
    let reply = send(
        &service,
        v1::IngestRequest {
            events: vec![],
            batches: vec![b],
        },
    )
    .await;
    assert_eq!((reply.accepted, reply.rejected), (0, 1), "{reply:?}");
}
