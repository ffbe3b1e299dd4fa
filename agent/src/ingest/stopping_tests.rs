//! What an `Ingest` request meets once the agent stopped taking events
//! (`ingest::stop_taking`): the gRPC drain on SIGTERM is bounded, so a request can still be
//! running after the final flush; it must be refused whole, never acknowledged unshipped.

use hourglass_rpc::proto::v1;
use hourglass_rpc::time::{hour_of, unix_now};
use tonic::Request;

use super::stop_taking;
use super::testing::{service, sketches};
use crate::config::Config;
use hourglass_rpc::proto::v1::ingest_server::Ingest;

fn one_event(item: &str, time: i64) -> v1::IngestRequest {
    v1::IngestRequest {
        events: vec![v1::Event {
            metric: "m".into(),
            item: item.as_bytes().to_vec().into(),
            time_unix_seconds: time,
            weight: 1,
            ..Default::default()
        }],
        batches: vec![],
    }
}

#[tokio::test]
async fn a_request_after_the_agent_stopped_taking_events_is_refused_and_adds_nothing() {
    let (service, table) = service(&Config::default(), None);
    let now = unix_now();
    let hour = hour_of(now).expect("an hour");
    let taken = service
        .send(Request::new(one_event("before", now)))
        .await
        .expect("taken while running");
    assert_eq!(taken.into_inner().accepted, 1);
    let before = sketches(&table, "m", &[hour]);
    assert!(before[0].is_some());

    stop_taking(&table, &service.taking);
    let refused = service
        .send(Request::new(one_event("after", now)))
        .await
        .expect_err("refused once stopped");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused}");
    assert_eq!(sketches(&table, "m", &[hour]), before, "nothing added");
    let text = service.metrics.encode();
    assert!(
        text.lines()
            .any(|l| l.contains("reason=\"stopping\"") && l.ends_with(" 1")),
        "{text}"
    );
}
