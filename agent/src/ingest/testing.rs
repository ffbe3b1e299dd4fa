//! What the tests of the `Ingest` service share: a service over a fresh table, a call, and
//! the encoded sketches a table holds.

use std::sync::{Arc, Mutex};

use hourglass_rpc::proto::v1;
use hourglass_rpc::proto::v1::ingest_server::Ingest;
use tonic::Request;

use crate::config::Config;
use crate::ingest::IngestService;
use crate::metrics::Metrics;
use crate::table::Table;

/// An `Ingest` service adding to a fresh table of `config`, every hour up to
/// `closed_through` (if any) closed; and that table.
pub(crate) fn service(
    config: &Config,
    closed_through: Option<u32>,
) -> (IngestService, Arc<Mutex<Table>>) {
    let config = Arc::new(config.clone());
    let mut table = Table::new(Arc::clone(&config), 1);
    if let Some(c) = closed_through {
        table.close_through(c);
    }
    let table = Arc::new(Mutex::new(table));
    let taking = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let service = IngestService::new(Arc::clone(&table), Arc::new(Metrics::new()), config, taking);
    (service, table)
}

/// `Ingest.Send`, which must not fail as a whole.
pub(crate) async fn send(
    service: &IngestService,
    request: v1::IngestRequest,
) -> v1::IngestResponse {
    service
        .send(Request::new(request))
        .await
        .unwrap()
        .into_inner()
}

/// The encoded sketches of `metric`'s entry in each of `hours`, if it has one.
pub(crate) fn sketches(
    table: &Arc<Mutex<Table>>,
    metric: &str,
    hours: &[u32],
) -> Vec<Option<Vec<Vec<u8>>>> {
    let t = table.lock().unwrap();
    hours
        .iter()
        .map(|&h| {
            t.entry(metric, h)
                .map(|e| e.sketches.iter().map(|s| s.encode()).collect())
        })
        .collect()
}
