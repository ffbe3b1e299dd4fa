//! The dashboard (`dashboard/`), as a browser draws it. Each test serves the real page
//! (the real `router` on an in-memory store, or canned API answers shaped as the API
//! writes them) on loopback and loads it in headless Chromium (`--dump-dom`, waiting for
//! `<body data-state="ready">`), then reads the cells and rows the page drew from the
//! DOM.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use super::tests::start;
use super::{HTML, JSON, static_route};
use crate::keys::{Epoch, Hour, HourKey};
use crate::store::{Dictionaries, Hourly, MemoryStore, SeriesName};
use hourglass_sketch::Kind;

/// The browser the repository's own dashboard check uses.
const CHROMIUM: &str = "/usr/bin/chromium";

/// The DOM of `url` once the page says it is ready, from headless Chromium.
async fn dump_dom(url: String) -> String {
    assert!(
        std::path::Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is needed (scripts/check-dashboard installs it)"
    );
    tokio::task::spawn_blocking(move || {
        let profile = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("timeout")
            .args([
                "120",
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-extensions",
                &format!("--user-data-dir={}", profile.path().display()),
                "--virtual-time-budget=30000",
                "--dump-dom",
                &url,
            ])
            .output()
            .expect("run chromium");
        let dom = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            dom.contains("<body data-state=\"ready\""),
            "the page did not get ready: {}\n{dom}",
            String::from_utf8_lossy(&out.stderr)
        );
        dom
    })
    .await
    .unwrap()
}

/// The attributes of every element of `dom` whose start tag begins with `prefix`
/// (`<td class="cell `), as (name, value) pairs.
fn elements(dom: &str, prefix: &str) -> Vec<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut rest = dom;
    while let Some(at) = rest.find(prefix) {
        let tag = &rest[at..];
        let end = tag.find('>').unwrap();
        let mut attrs = Vec::new();
        let mut text = &tag[..end];
        while let Some(eq) = text.find("=\"") {
            let name = text[..eq].rsplit(' ').next().unwrap().to_string();
            let value_start = eq + 2;
            let close = text[value_start..].find('"').unwrap();
            attrs.push((name, text[value_start..value_start + close].to_string()));
            text = &text[value_start + close + 1..];
        }
        out.push(attrs);
        rest = &tag[end..];
    }
    out
}

fn attr<'a>(attrs: &'a [(String, String)], name: &str) -> &'a str {
    attrs
        .iter()
        .find(|(n, _)| n == name)
        .map_or("", |(_, v)| v.as_str())
}

/// A store where each of `servers` (name, labels) pushed a `visitors` sketch and declared
/// itself live in the hours of `live`, and in no other; one item per server and hour.
/// A server of a test store: its name, labels and live hours.
type TestServer<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [u32]);

fn store_of(servers: &[TestServer<'_>]) -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new());
    let visitors = store
        .series_id_or_create(&SeriesName::new("visitors", vec![], Kind::Distinct))
        .unwrap();
    for (name, labels, live) in servers {
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let server = store.register_server(name, &labels).unwrap();
        for hour in live.iter() {
            let mut hll = hourglass_sketch::hll::Hll::new(12).unwrap();
            hll.insert(format!("{name}-{hour}").as_bytes());
            let key = HourKey {
                series: visitors,
                hour: Hour(*hour),
                server,
                epoch: Epoch(1),
            };
            store.put_hourly(&[(key, 1, hll.encode().into())]).unwrap();
        }
        let hours: Vec<Hour> = live.iter().copied().map(Hour).collect();
        store.mark_live(server, &hours).unwrap();
    }
    store
}

/// Hours 100..103 (1970-01-05, 04:00 to 07:00 UTC): the dashboard's view of them.
const VIEW: &str = "/?metric=visitors&from=1970-01-05T04%3A00%3A00Z&to=1970-01-05T07%3A00%3A00Z";

/// 120 servers, each live in hour 100 only: each misses hours 101 and 102, so every cell
/// of the coverage grid (one day, 1970-01-05) has 2 hours missing. The API lists at most
/// 100 servers by name in `coverage.missing`; the grid must not show the others as
/// complete.
#[tokio::test(flavor = "multi_thread")]
async fn the_grid_does_not_show_unlisted_missing_servers_as_complete() {
    let names: Vec<String> = (0..120).map(|i| format!("s{i:03}")).collect();
    let servers: Vec<TestServer<'_>> = names
        .iter()
        .map(|n| (n.as_str(), &[][..], &[100u32][..]))
        .collect();
    let (addr, _stop, _server) = start(store_of(&servers)).await;
    let dom = dump_dom(format!("http://{addr}{VIEW}")).await;
    // The API's own total: 120 servers x 2 hours.
    assert!(
        dom.contains("data-server-hours-missing=\"240\""),
        "the coverage panel's total is not 240"
    );
    let cells = elements(&dom, "<td class=\"cell ");
    assert_eq!(cells.len(), 120, "one cell per server and day");
    let complete: Vec<&str> = cells
        .iter()
        .filter(|c| attr(c, "data-level") == "ok")
        .map(|c| attr(c, "data-server"))
        .collect();
    assert!(
        complete.is_empty(),
        "{} servers, each missing 2 of 3 hours, are drawn as 'no hour missing' (green): {:?}",
        complete.len(),
        complete
    );
}

/// The servers a selection picks, on the page (servers table, coverage rows) and in the
/// aggregator (`glob::matches`), for `server=web-[^1]`: the aggregator reads `[^…]` as
/// a negated set, as `[!…]`.
#[tokio::test(flavor = "multi_thread")]
async fn the_page_selects_the_servers_the_aggregator_selects() {
    let store = store_of(&[
        ("web-1", &[("region", "eu")], &[100, 101, 102]),
        ("web-2", &[("region", "eu")], &[100]),
    ]);
    let (addr, _stop, _server) = start(store).await;
    let glob = "web-[^1]";
    let dom = dump_dom(format!("http://{addr}{VIEW}&server=web-%5B%5E1%5D")).await;
    let mut problems = Vec::new();
    for row in elements(&dom, "<tr class=\"") {
        let name = attr(&row, "data-server");
        if name.is_empty() || attr(&row, "data-selected").is_empty() {
            continue;
        }
        let page = attr(&row, "data-selected") == "true";
        let aggregator = crate::glob::matches(glob, name);
        if page != aggregator {
            problems.push(format!(
                "servers table: {name} selected={page}, but the aggregator's glob {glob} says {aggregator}"
            ));
        }
    }
    let grid: Vec<String> = elements(&dom, "<td class=\"cell ")
        .iter()
        .map(|c| format!("{}={}", attr(c, "data-server"), attr(c, "data-level")))
        .collect();
    if grid.iter().any(|c| c.starts_with("web-1=")) {
        problems.push(format!(
            "coverage grid has a row for web-1, which the query did not select: {grid:?}"
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Names and items from the API are text on the page, never markup.
#[tokio::test(flavor = "multi_thread")]
async fn names_and_items_are_shown_as_text() {
    let store = store_of(&[("<b>srv</b>", &[("region", "<i>eu</i>")], &[100, 101, 102])]);
    let pages = store
        .series_id_or_create(&SeriesName::new("visitors", vec![], Kind::Frequency))
        .unwrap();
    let server = store
        .register_server("<b>srv</b>", &[("region".into(), "<i>eu</i>".into())])
        .unwrap();
    let mut counts = hourglass_sketch::frequency::Frequency::new(
        hourglass_sketch::frequency::FrequencyParams::default(),
    )
    .unwrap();
    counts
        .insert(b"<img src=x onerror=\"document.body.dataset.pwned='1'\">")
        .unwrap();
    let key = HourKey {
        series: pages,
        hour: Hour(100),
        server,
        epoch: Epoch(1),
    };
    store
        .put_hourly(&[(key, 1, counts.encode().into())])
        .unwrap();
    let (addr, _stop, _server) = start(store).await;
    let dom = dump_dom(format!("http://{addr}{VIEW}")).await;
    // Markup from the API would be an element: `><b>`, `<img src="x"` (attribute values
    // never hold an unescaped `"`, and text nodes never an unescaped `<`).
    assert!(!dom.contains("data-pwned"), "a script ran from an item");
    assert!(!dom.contains("<img src=\"x\""), "an item became an element");
    assert!(!dom.contains("><b>srv</b>"), "a server name became markup");
    assert!(!dom.contains("><i>eu</i>"), "a label became markup");
    assert!(
        dom.contains(">&lt;b&gt;srv&lt;/b&gt;<"),
        "the server is shown as text"
    );
    assert!(
        dom.contains("&lt;img src=x onerror="),
        "the item is shown as text"
    );
}

/// Canned API answers, shaped as `api` writes them: a metric whose every answer has
/// two partitions that did not answer (cluster mode) and no server-hour missing.
fn canned(kinds: &'static [&'static str]) -> Router {
    let coverage = serde_json::json!({
        "sketches_merged": 2, "server_hours_missing": 0, "missing": [],
        "partitions_missing": 2, "missing_partitions": [3, 7]
    });
    let range = serde_json::json!({
        "from": "1970-01-05T00:00:00Z", "to": "1970-01-07T00:00:00Z",
        "start_hour": 96, "end_hour": 144
    });
    let days = ["1970-01-05", "1970-01-06"];
    let json =
        |v: serde_json::Value| ([(header::CONTENT_TYPE, JSON)], v.to_string()).into_response();
    let series: Vec<serde_json::Value> = kinds
        .iter()
        .map(|k| serde_json::json!({"metric": "m", "tags": {}, "kind": k}))
        .collect();
    let (c1, c2, c3) = (coverage.clone(), coverage.clone(), coverage.clone());
    let (r1, r2, r3) = (range.clone(), range.clone(), range.clone());
    Router::new()
        .route(
            "/",
            static_route(include_str!("dashboard/index.html"), HTML),
        )
        .route(
            "/app.js",
            static_route(include_str!("dashboard/app.js"), "text/javascript"),
        )
        .route(
            "/style.css",
            static_route(include_str!("dashboard/style.css"), "text/css"),
        )
        .route(
            "/favicon.svg",
            static_route(include_str!("dashboard/favicon.svg"), "image/svg+xml"),
        )
        .route(
            "/api/v1/series",
            get(move || {
                let series = series.clone();
                async move { json(serde_json::json!({ "series": series })) }
            }),
        )
        .route(
            "/api/v1/servers",
            get(move || async move {
                json(serde_json::json!({"servers": [{"name": "web-1", "labels": {"region": "eu"}}]}))
            }),
        )
        .route(
            "/api/v1/distinct",
            get(move || {
                let (coverage, range) = (c1.clone(), r1.clone());
                async move {
                    let answer = serde_json::json!({"estimate": 2.0, "std_error": 0.01, "lower95": 1.98, "upper95": 2.02});
                    let groups: Vec<_> = days.iter().map(|d| serde_json::json!({
                        "key": d, "time": format!("{d}T00:00:00Z"), "answer": answer, "coverage": coverage
                    })).collect();
                    json(serde_json::json!({"metric": "m", "range": range, "answer": answer, "coverage": coverage, "groups": groups}))
                }
            }),
        )
        .route(
            "/api/v1/topk",
            get(move || {
                let (coverage, range) = (c2.clone(), r2.clone());
                async move {
                    let items = serde_json::json!([{"item": "/cart", "estimate": 5, "lower": 5, "upper": 5}]);
                    let groups: Vec<_> = days.iter().map(|d| serde_json::json!({
                        "key": d, "time": format!("{d}T00:00:00Z"), "items": items, "coverage": coverage
                    })).collect();
                    json(serde_json::json!({"metric": "m", "range": range, "k": 10, "items": items, "coverage": coverage, "groups": groups}))
                }
            }),
        )
        .route(
            "/api/v1/membership",
            get(move || {
                let (coverage, range) = (c3.clone(), r3.clone());
                async move {
                    let answer = serde_json::json!({"maybe_present": false, "fill_ratio": 0.1, "estimated_fpr": 0.0001, "past_design_point": false});
                    json(serde_json::json!({"metric": "m", "range": range, "item": "user1", "answer": answer, "coverage": coverage, "groups": []}))
                }
            }),
        )
}

async fn serve_canned(kinds: &'static [&'static str]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, canned(kinds)).await });
    addr
}

/// In cluster mode an answer can miss whole partitions (`coverage.partitions_missing`):
/// the page must say so wherever it shows coverage, and a membership "absent" is then
/// not certain.
#[tokio::test(flavor = "multi_thread")]
async fn the_page_warns_when_partitions_did_not_answer() {
    let mut problems = Vec::new();
    let view = "/?metric=m&from=1970-01-05&to=1970-01-07&item=user1";

    // A frequency and membership metric: coverage grid from top-K, the top-K table, a
    // membership lookup.
    let addr = serve_canned(&["frequency", "membership"]).await;
    let dom = dump_dom(format!("http://{addr}{view}")).await;
    if !dom.to_lowercase().contains("partition") {
        problems.push(
            "frequency+membership metric: nothing on the page mentions the 2 partitions that \
             did not answer (coverage grid all green, summary 'no server-hour missing', top-K \
             without any coverage)"
                .to_string(),
        );
    }
    if dom.contains("absent (certain)") {
        problems.push(
            "membership: 'absent (certain)' although 2 partitions did not answer".to_string(),
        );
    }
    let levels: Vec<String> = elements(&dom, "<td class=\"cell ")
        .iter()
        .map(|c| attr(c, "data-level").to_string())
        .collect();
    if !levels.is_empty() && levels.iter().all(|l| l == "ok") {
        problems.push(format!(
            "coverage grid: every cell 'no hour missing' ({levels:?}) although partitions are missing"
        ));
    }

    // A distinct metric: the total's coverage note.
    let addr = serve_canned(&["distinct"]).await;
    let dom = dump_dom(format!("http://{addr}{view}")).await;
    let notes = elements(&dom, "<p class=\"coverage-note");
    match notes.first() {
        Some(note) if !attr(note, "class").contains("warn") => problems.push(format!(
            "distinct: the coverage note is class {:?} (not a warning) with partitions missing",
            attr(note, "class")
        )),
        None => problems.push("distinct: no coverage note".to_string()),
        _ => {}
    }
    let summary = dom
        .split("id=\"coverage-summary\"")
        .nth(1)
        .and_then(|s| s.split_once('>'))
        .and_then(|(_, s)| s.split('<').next())
        .unwrap_or("");
    if !summary.to_lowercase().contains("partition") {
        problems.push(format!(
            "distinct: the coverage panel's summary says {summary:?} with 2 partitions missing"
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}
