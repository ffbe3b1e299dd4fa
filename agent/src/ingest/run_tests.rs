//! A batch's events are added a run of one hour at a time (`ingest::Run`): the result must
//! be exactly that of adding them one by one, as single events are. Batches in the
//! `items` form and the `packed_items` form and the same events one by one give the same
//! reply (counts, rejected indexes and reasons) and the same sketches: random batches
//! over several hours, interleaved, with refused events of every kind (empty, too long,
//! too far ahead, too late, in a closed hour), times at every edge of the check, per-item
//! weights, every sketch kind, and a frequent-items summary small enough that the order
//! of its items decides what it keeps.

use std::time::Duration;

use hourglass_rpc::packed;
use hourglass_rpc::proto::v1;
use hourglass_rpc::time::unix_now;
use hourglass_sketch::format::Kind;

use super::testing::{send, service, sketches};
use crate::config::Config;

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

/// Every sketch kind; a frequent-items summary of about 10 counters, so the order in
/// which items reach it decides what it keeps.
fn config(max_future: Duration, lateness: Duration) -> Config {
    let mut c = Config {
        default_kinds: vec![Kind::Distinct, Kind::Frequency, Kind::Membership],
        lateness,
        ..Config::default()
    };
    c.limits.max_future = max_future;
    c.defaults.epsilon = 0.1;
    c
}

/// One event of a test: item, time, weight.
type Ev = (Vec<u8>, i64, u64);

/// A batch of metric "m" of `events`, its items in the `packed_items` form or the `items`
/// form.
fn batch(events: &[Ev], packed_form: bool) -> v1::SeriesBatch {
    v1::SeriesBatch {
        metric: "m".into(),
        items: if packed_form {
            Default::default()
        } else {
            events.iter().map(|e| &e.0).collect()
        },
        packed_items: if packed_form {
            packed::pack(events.iter().map(|e| e.0.as_slice())).into()
        } else {
            Default::default()
        },
        times_unix_seconds: events.iter().map(|e| e.1).collect(),
        weights: events.iter().map(|e| e.2).collect(),
        ..Default::default()
    }
}

/// Sends `batches` (each a list of events of metric "m") three ways — as `items`
/// batches, as `packed_items` batches, and as single events — to fresh agents, all in
/// one request each, and asserts the same replies and sketches. Retries while the clock
/// ticks during a round, since the agent reads `now` itself. Returns the reply.
async fn same_three_ways(
    config: &Config,
    closed: Option<u32>,
    make: impl Fn(i64) -> Vec<Vec<Ev>>,
) -> v1::IngestResponse {
    for _ in 0..50 {
        let now = unix_now();
        let batches = make(now);
        let hour = (now / 3600) as u32;
        let hours: Vec<u32> = (hour.saturating_sub(6)..=hour + 6).collect();
        let (by_items, items_table) = service(config, closed);
        let (by_packed, packed_table) = service(config, closed);
        let (by_event, event_table) = service(config, closed);
        let a = send(
            &by_items,
            v1::IngestRequest {
                events: vec![],
                batches: batches.iter().map(|b| batch(b, false)).collect(),
            },
        )
        .await;
        let p = send(
            &by_packed,
            v1::IngestRequest {
                events: vec![],
                batches: batches.iter().map(|b| batch(b, true)).collect(),
            },
        )
        .await;
        let e = send(
            &by_event,
            v1::IngestRequest {
                events: batches
                    .iter()
                    .flatten()
                    .map(|(item, time, weight)| v1::Event {
                        metric: "m".into(),
                        item: item.clone().into(),
                        time_unix_seconds: *time,
                        weight: *weight,
                        ..Default::default()
                    })
                    .collect(),
                batches: vec![],
            },
        )
        .await;
        if unix_now() != now {
            continue; // the agents may have read different clocks
        }
        assert_eq!(a, e, "items batch vs events");
        assert_eq!(p, e, "packed batch vs events");
        let n: usize = batches.iter().map(Vec::len).sum();
        assert_eq!(a.accepted + a.rejected, n as u64);
        let want = sketches(&event_table, "m", &hours);
        assert_eq!(sketches(&items_table, "m", &hours), want, "items sketches");
        assert_eq!(
            sketches(&packed_table, "m", &hours),
            want,
            "packed sketches"
        );
        return e;
    }
    panic!("the clock never held still for a round");
}

fn item(i: u64) -> Vec<u8> {
    format!("user-{i}").into_bytes()
}

/// Times at and around every edge the check has: hour starts and ends, the
/// max_future bound (exactly at and one past), the lateness bound, a closed hour's last
/// second and the next hour's first, 0 (now), negative times and the extremes; items of
/// exactly max_item_len and one more, and empty ones; weights 0, 1 and large.
#[tokio::test]
async fn runs_at_every_edge_of_the_check_match_one_by_one() {
    let max_item_len = Config::default().limits.max_item_len;
    for (future, lateness) in [
        (300, 600),
        (0, 600),
        (3599, 0),
        (3600, 3600),
        (7200, 1),
        (u64::MAX, 600),
    ] {
        let config = config(Duration::from_secs(future), Duration::from_secs(lateness));
        let closed_offset = 4;
        let make = |now: i64| -> Vec<Vec<Ev>> {
            let h = now / 3600 * 3600;
            let f = now.saturating_add(i64::try_from(future).unwrap_or(i64::MAX));
            let late_end = now - lateness as i64; // hours ending at or before are late
            let closed_end = (now / 3600 - closed_offset + 1) * 3600;
            let mut times = vec![
                h,
                h + 1,
                h + 3599,
                h + 3600,
                h + 3601,
                h - 1,
                h - 3600,
                h - 3601,
                h + 7200,
                h + 7199,
                f,
                f - 1,
                f.saturating_add(1),
                late_end,
                late_end - 1,
                late_end + 1,
                late_end / 3600 * 3600,
                late_end / 3600 * 3600 - 1,
                closed_end - 1,
                closed_end,
                closed_end + 1,
                0,
                -1,
                -3600,
                i64::MIN,
                i64::MAX,
                now,
            ];
            // The same times again in another order: runs that start inside the
            // accepted range and then leave it.
            let mut back = times.clone();
            back.reverse();
            times.extend(back);
            times.extend([h, f, f.saturating_add(1), h, f, h + 3599, h + 3600, h]);
            let mut events = Vec::new();
            for (i, t) in times.iter().enumerate() {
                let it = match i % 7 {
                    0 => vec![b'x'; max_item_len],
                    1 => vec![b'y'; max_item_len + 1],
                    2 => Vec::new(),
                    _ => item(i as u64 % 23),
                };
                let w = [0, 1, 5, u64::MAX / 4][i % 4];
                events.push((it, *t, w));
            }
            // Two batches of the same series in one request, and a third interleaving
            // hours one event at a time.
            let third = (0..60)
                .map(|i| (item(i % 31), h - 3600 * (i as i64 % 3), 1 + i % 3))
                .collect();
            let half = events.len() / 2;
            let second = events.split_off(half);
            vec![events, second, third]
        };
        let closed = Some(((unix_now() / 3600) - closed_offset) as u32);
        let reply = same_three_ways(&config, closed, make).await;
        assert!(reply.accepted > 0 && reply.rejected > 0, "{reply:?}");
    }
}

/// Many distinct items over a frequent-items summary of ~10 counters, in hours that
/// alternate in runs of different lengths, with weights: what each hour's summary keeps
/// depends on the order its items arrive in, which must stay that of the events.
#[tokio::test]
async fn frequency_order_and_weights_of_runs_match_one_by_one() {
    let config = config(Duration::from_secs(300), Duration::from_secs(3600 * 3));
    let make = |now: i64| -> Vec<Vec<Ev>> {
        let hour = now / 3600;
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut next = |n: u64| rng.below(n);
        let mut batches = Vec::new();
        for _ in 0..4 {
            let mut b = Vec::new();
            let mut h = hour;
            for _ in 0..400 {
                if next(5) == 0 {
                    h = hour - next(3) as i64;
                }
                let t = if next(10) == 0 {
                    0
                } else {
                    h * 3600 + next(3600) as i64
                };
                b.push((item(next(60)), t, next(4) * next(1000)));
            }
            batches.push(b);
        }
        batches
    };
    same_three_ways(&config, None, make).await;
}

/// When an event of a random batch happens, relative to the clock of the round.
#[derive(Clone, Copy)]
enum When {
    /// No time: now.
    Now,
    /// Two hours ahead: too far.
    TooFarAhead,
    /// This second of the hour this many hours from the current one.
    InHour(i64, i64),
}

/// Random batches, 40 rounds: each a run of events whose hour changes now and then, over a
/// closed hour, three open ones (this hour and the two before) and the next one, which is
/// accepted only up to limits.max_future ahead of the clock; some items empty or too long.
#[tokio::test]
async fn a_batch_added_in_runs_is_the_same_as_its_events_one_by_one() {
    let config = Config {
        default_kinds: vec![Kind::Distinct, Kind::Frequency, Kind::Membership],
        ..Config::default()
    };
    let long = vec![b'x'; config.limits.max_item_len + 1];
    let closed = Some((unix_now() / 3600 - 3) as u32);
    let mut rng = Rng(0x05EE_D0F0_5EED);
    for _round in 0..40 {
        let n = 1 + rng.below(300) as usize;
        let mut events: Vec<(Vec<u8>, When, u64)> = Vec::with_capacity(n);
        let mut dh = -(rng.below(3) as i64);
        for _ in 0..n {
            // Runs: the hour changes now and then, not at every event.
            if rng.below(8) == 0 {
                dh = 1 - rng.below(5) as i64;
            }
            let when = match rng.below(20) {
                0 => When::Now,
                1 => When::TooFarAhead,
                _ => When::InHour(dh, rng.below(3600) as i64),
            };
            let item = match rng.below(30) {
                0 => Vec::new(),
                1 => long.clone(),
                _ => format!("user-{}", rng.below(500)).into_bytes(),
            };
            events.push((item, when, rng.below(4)));
        }
        let make = |now: i64| -> Vec<Vec<Ev>> {
            let hour = now / 3600;
            let batch = events
                .iter()
                .map(|(item, when, weight)| {
                    let time = match *when {
                        When::Now => 0,
                        When::TooFarAhead => now + 3600 * 2,
                        When::InHour(dh, second) => (hour + dh) * 3600 + second,
                    };
                    (item.clone(), time, *weight)
                })
                .collect();
            vec![batch]
        };
        same_three_ways(&config, closed, make).await;
    }
}
