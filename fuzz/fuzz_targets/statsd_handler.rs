//! Whole datagrams through the agent's `StatsdHandler` into a fresh `Table`: parsing,
//! series resolution (tag limits, validation, aliases, the series limit), hour checks
//! and insertion into the sketches. The configuration is [`hourglass_fuzz::small_config`]:
//! every kind, tiny sketches and a limit of 4 series, so each run is cheap and reaches
//! the limit.
//!
//! Input: one or more datagrams separated by 0xFF (a byte that never occurs in UTF-8, so
//! in no valid line). Asserts, beyond "never panics": the table holds at most
//! `limits.max_series` series, and every series it holds round-trips through its text
//! form (what the checkpoint stores) and wire form (what a push carries).
#![no_main]

use std::sync::{Arc, Mutex, OnceLock};

use hourglass_agent::Config;
use hourglass_agent::ingest::StatsdHandler;
use hourglass_agent::metrics::Metrics;
use hourglass_agent::table::{self, Table};
use libfuzzer_sys::fuzz_target;

fn shared() -> &'static (Arc<Config>, Arc<Metrics>) {
    static SHARED: OnceLock<(Arc<Config>, Arc<Metrics>)> = OnceLock::new();
    SHARED.get_or_init(|| {
        let config = hourglass_fuzz::small_config();
        (Arc::new(config), Arc::new(Metrics::new()))
    })
}

fuzz_target!(|data: &[u8]| {
    let (config, metrics) = shared();
    let table = Arc::new(Mutex::new(Table::new(Arc::clone(config), 1)));
    let mut handler = StatsdHandler::new(Arc::clone(&table), Arc::clone(metrics));
    handler.handle(data.split(|&b| b == 0xFF));
    let table = table::lock(&table);
    assert!(table.series_count() <= config.limits.max_series);
    for key in table.keys() {
        let (series, _entry) = table.get(key).expect("a listed key is held");
        hourglass_fuzz::check_series(series);
    }
});
