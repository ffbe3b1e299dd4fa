//! A batch's events are added a run of one hour at a time (`ingest::Run`): the result must
//! be exactly that of adding them one by one, as single events are. Random batches over
//! several hours, interleaved, with refused events of every kind (empty, too long, too far
//! ahead, too late, in a closed hour), per-item weights and every sketch kind, give the
//! same reply (counts, indexes and reasons) and the same sketches both ways.

use std::sync::{Arc, Mutex};

use hourglass_rpc::packed;
use hourglass_rpc::proto::v1;
use hourglass_rpc::time::unix_now;

use crate::config::Config;
use crate::ingest::IngestService;
use crate::ingest_testing::{self, send, sketches};
use crate::table::Table;
use hourglass_sketch::format::Kind;

fn service(closed_through: u32) -> (IngestService, Arc<Mutex<Table>>) {
    let config = Config {
        default_kinds: vec![Kind::Distinct, Kind::Frequency, Kind::Membership],
        ..Config::default()
    };
    ingest_testing::service(&config, Some(closed_through))
}

/// xorshift64*: a fixed seed gives the same batches every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

#[tokio::test]
async fn a_batch_added_in_runs_is_the_same_as_its_events_one_by_one() {
    let now = unix_now();
    let hour = now / 3600;
    // Hours in play: a closed one, three open ones (this hour and the two before) and
    // the next one, which is accepted only up to limits.max_future ahead of the clock.
    let closed = (hour - 3) as u32;
    let long = vec![b'x'; Config::default().limits.max_item_len + 1];
    let mut rng = Rng(0x05EE_D0F0_5EED);
    for round in 0..40 {
        let n = 1 + rng.below(300) as usize;
        let mut items: Vec<Vec<u8>> = Vec::with_capacity(n);
        let mut times = Vec::with_capacity(n);
        let mut weights = Vec::with_capacity(n);
        let mut h = hour - rng.below(3) as i64;
        for _ in 0..n {
            // Runs: the hour changes now and then, not at every event.
            if rng.below(8) == 0 {
                h = hour + 1 - rng.below(5) as i64;
            }
            let time = match rng.below(20) {
                0 => 0,              // no time: now
                1 => now + 3600 * 2, // too far ahead
                _ => h * 3600 + rng.below(3600) as i64,
            };
            let item = match rng.below(30) {
                0 => Vec::new(),
                1 => long.clone(),
                _ => format!("user-{}", rng.below(500)).into_bytes(),
            };
            items.push(item);
            times.push(time);
            weights.push(rng.below(4));
        }
        let (by_batch, batch_table) = service(closed);
        let (by_event, event_table) = service(closed);
        let batch = v1::SeriesBatch {
            metric: "m".into(),
            packed_items: packed::pack(items.iter().map(Vec::as_slice)).into(),
            times_unix_seconds: times.clone(),
            weights: weights.clone(),
            ..Default::default()
        };
        let events = (0..n)
            .map(|j| v1::Event {
                metric: "m".into(),
                item: items[j].clone().into(),
                time_unix_seconds: times[j],
                weight: weights[j],
                ..Default::default()
            })
            .collect();
        let a = send(
            &by_batch,
            v1::IngestRequest {
                events: vec![],
                batches: vec![batch],
            },
        )
        .await;
        let b = send(
            &by_event,
            v1::IngestRequest {
                events,
                batches: vec![],
            },
        )
        .await;
        assert_eq!(a, b, "round {round}");
        assert_eq!(a.accepted + a.rejected, n as u64);
        let hours: Vec<u32> = ((hour - 4)..=(hour + 1)).map(|h| h as u32).collect();
        assert_eq!(
            sketches(&batch_table, "m", &hours),
            sketches(&event_table, "m", &hours),
            "round {round}"
        );
    }
}
