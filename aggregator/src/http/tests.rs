//! The HTTP port's own rules, on an in-memory store: the OpenAPI document against the
//! routes served, every failure as JSON, and the auth check. The API's own (query string,
//! JSON shapes) are `api/tests.rs`; the answers against gRPC's, TLS and the real binary
//! are tests/integration/http.rs.

//!
//! The port, its router and a stocked store for every test of `http` are here too.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::Value;
use tokio::net::TcpListener;
use tower::ServiceExt;

use super::api::ROUTES;
use super::*;
use crate::auth::Auth;
use crate::config::LimitsConfig;
use crate::keys::{Epoch, Hour, HourKey};
use crate::metrics::Metrics;
use crate::service::QueryService;
use crate::store::{Dictionaries, Hourly, MemoryStore, SeriesName, Store};
use hourglass_sketch::Kind;

// ---------------------------------------------------------------------------------------
// The port and its router over an in-memory store

/// The HTTP port (the real `serve`) on a free loopback port, over `store`, without auth:
/// its address and the sender that shuts it down, and the server task.
pub(crate) async fn start(
    store: Arc<dyn Store>,
) -> (
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let query = QueryService::new(store, Arc::new(Metrics::new()), LimitsConfig::default());
    let state = HttpState {
        query,
        auth: Auth::default(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, state, None, async move {
        let _ = stopped.await;
    }));
    (addr, stop, server)
}

/// An API on `store`, with `auth`.
pub(crate) fn app(store: Arc<dyn Store>, auth: Auth) -> Router {
    let query = QueryService::new(store, Arc::new(Metrics::new()), LimitsConfig::default());
    router(Arc::new(HttpState { query, auth }))
}

/// `method path` with `headers`: the status, the headers and the body.
pub(crate) async fn call(
    app: &Router,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, axum::http::HeaderMap, String) {
    let (status, headers, bytes) = call_raw(app, method, path, headers).await;
    (status, headers, String::from_utf8(bytes).unwrap())
}

/// `method path` with `headers`: the status, the headers and the body as sent.
async fn call_raw(
    app: &Router,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let mut request = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, headers, body.to_vec())
}

/// A GET's status and JSON body; the content type must be JSON.
pub(crate) async fn get_json(
    app: &Router,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let (status, response_headers, body) = call(app, Method::GET, path, headers).await;
    assert_eq!(
        response_headers[header::CONTENT_TYPE],
        "application/json",
        "{path}"
    );
    let value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
    (status, value)
}

/// A store with `visitors` (distinct) and `pages` (frequency, `/cart` once in each
/// sketch) from web-1 in hours 100 and 101 and web-2 in hour 101.
pub(crate) fn stocked() -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new());
    let visitors = store
        .series_id_or_create(&SeriesName::new("visitors", vec![], Kind::Distinct))
        .unwrap();
    let pages = store
        .series_id_or_create(&SeriesName::new("pages", vec![], Kind::Frequency))
        .unwrap();
    for (name, hours) in [("web-1", 100..102), ("web-2", 101..102)] {
        let live: Vec<Hour> = hours.clone().map(Hour).collect();
        let server = store
            .register_server(name, &[("region".into(), "eu".into())])
            .unwrap();
        for hour in hours {
            let key = |series| HourKey {
                series,
                hour: Hour(hour),
                server,
                epoch: Epoch(1),
            };
            let mut hll = hourglass_sketch::hll::Hll::new(12).unwrap();
            hll.insert(format!("{name}-{hour}").as_bytes());
            let mut counts = hourglass_sketch::frequency::Frequency::new(
                hourglass_sketch::frequency::FrequencyParams::default(),
            )
            .unwrap();
            counts.insert(b"/cart").unwrap();
            let rows = [
                (key(visitors), 1, hll.encode().into()),
                (key(pages), 1, counts.encode().into()),
            ];
            store.put_hourly(&rows).unwrap();
        }
        store.mark_live(server, &live).unwrap();
    }
    store
}

// ---------------------------------------------------------------------------------------
// The port's rules

fn document() -> Value {
    serde_json::from_str(OPENAPI).expect("openapi.json is JSON")
}

/// Follows a `$ref` inside the document.
fn resolve<'a>(doc: &'a Value, value: &'a Value) -> &'a Value {
    match value.get("$ref").and_then(Value::as_str) {
        Some(path) => {
            let pointer = path.strip_prefix('#').expect("a local $ref");
            doc.pointer(pointer)
                .unwrap_or_else(|| panic!("{path} is not in the document"))
        }
        None => value,
    }
}

#[test]
fn the_openapi_document_describes_exactly_the_routes_served() {
    let doc = document();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let documented: BTreeSet<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let served: BTreeSet<&str> = routes().into_iter().map(|(path, _)| path).collect();
    assert_eq!(
        documented, served,
        "the document's paths and the router's differ"
    );
    for (path, item) in doc["paths"].as_object().unwrap() {
        let methods: Vec<&String> = item.as_object().unwrap().keys().collect();
        assert_eq!(methods, ["get"], "{path}: every route is GET");
        let responses = &item["get"]["responses"];
        assert!(responses.get("200").is_some(), "{path} documents no 200");
        // Every response refers to something the document holds.
        for response in responses.as_object().unwrap().values() {
            let response = resolve(&doc, response);
            assert!(response["description"].is_string(), "{path}: {response}");
        }
    }
    for route in ROUTES {
        let operation = &doc["paths"][route.path]["get"];
        let parameters: BTreeSet<&str> = operation["parameters"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: no parameters listed", route.path))
            .iter()
            .map(|p| resolve(&doc, p)["name"].as_str().unwrap())
            .collect();
        let taken: BTreeSet<&str> = route.parameters.iter().copied().collect();
        assert_eq!(parameters, taken, "{}: parameters", route.path);
        // Every API route can be refused for its query string and its caller.
        for status in ["400", "401", "403", "500"] {
            assert!(
                operation["responses"].get(status).is_some(),
                "{} documents no {status}",
                route.path
            );
        }
    }
    // Every $ref anywhere resolves.
    fn refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    out.push(r);
                }
                map.values().for_each(|v| refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(all.len() > 20);
    for r in all {
        assert!(doc.pointer(&r[1..]).is_some(), "{r} does not resolve");
    }
}

#[tokio::test]
async fn every_failure_is_json_with_the_grpc_code_and_message() {
    let app = app(stocked(), Auth::default());
    let failures = [
        (
            "/api/v1/distinct",
            400,
            "INVALID_ARGUMENT",
            "selector.metric is required",
        ),
        (
            "/api/v1/distinct?metric=9x",
            400,
            "INVALID_ARGUMENT",
            "selector.metric: metric name \"9x\" is invalid",
        ),
        (
            "/api/v1/distinct?metric=nothing",
            404,
            "NOT_FOUND",
            "nothing",
        ),
        (
            "/api/v1/distinct?metric=visitors&bogus=1",
            400,
            "INVALID_ARGUMENT",
            "unknown parameter \"bogus\"",
        ),
        (
            "/api/v1/distinct?metric=visitors&metric=pages",
            400,
            "INVALID_ARGUMENT",
            "given more than once",
        ),
        (
            "/api/v1/distinct?metric=visitors&from=yesterday",
            400,
            "INVALID_ARGUMENT",
            "from: cannot read time",
        ),
        (
            "/api/v1/distinct?metric=visitors&group_by=week",
            400,
            "INVALID_ARGUMENT",
            "group_by: ",
        ),
        (
            "/api/v1/distinct?metric=visitors&item=x",
            400,
            "INVALID_ARGUMENT",
            "unknown parameter \"item\"",
        ),
        (
            "/api/v1/topk?metric=pages&k=ten",
            400,
            "INVALID_ARGUMENT",
            "k: \"ten\"",
        ),
        (
            "/api/v1/topk?metric=pages&k=0",
            400,
            "INVALID_ARGUMENT",
            "k must be at least 1",
        ),
        (
            "/api/v1/frequency?metric=pages",
            400,
            "INVALID_ARGUMENT",
            "item is required",
        ),
        (
            "/api/v1/membership?metric=visitors&item=a",
            404,
            "NOT_FOUND",
            "membership",
        ),
        (
            "/api/v1/servers?x=1",
            400,
            "INVALID_ARGUMENT",
            "takes no parameters",
        ),
        ("/api/v1/nothing", 404, "NOT_FOUND", "/api/v1/nothing"),
        ("/nothing/at/all", 404, "NOT_FOUND", "no such path"),
    ];
    for (path, status, code, message) in failures {
        let (got, v) = get_json(&app, path, &[]).await;
        assert_eq!(got.as_u16(), status, "{path}: {v}");
        assert_eq!(v["error"]["code"], code, "{path}: {v}");
        let text = v["error"]["message"].as_str().unwrap();
        assert!(text.contains(message), "{path}: {text}");
    }
    let (status, headers, body) = call(&app, Method::POST, "/api/v1/distinct?metric=x", &[]).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers[header::ALLOW], "GET, HEAD");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "UNIMPLEMENTED");
}

#[tokio::test]
async fn static_files_and_the_document_need_no_token_and_the_api_does() {
    let dir = tempfile::tempdir().unwrap();
    let token = |name: &str, value: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, value).unwrap();
        path.display().to_string()
    };
    let config: crate::auth::AuthConfig = toml::from_str(&format!(
        "[[tokens]]\nname = \"dash\"\nrole = \"query\"\nfile = \"{}\"\n\n[[tokens]]\nname = \"web\"\nrole = \"agent\"\nservers = [\"web-*\"]\nfile = \"{}\"\n",
        token("query", "query-token-0123456789"),
        token("agent", "agent-token-0123456789"),
    ))
    .unwrap();
    let app = app(stocked(), Auth::load(&config).unwrap());
    for (path, content_type) in [
        ("/", "text/html; charset=utf-8"),
        ("/app.js", "text/javascript"),
        ("/style.css", "text/css"),
        ("/favicon.svg", "image/svg+xml"),
        ("/api/v1/openapi.json", "application/json"),
    ] {
        let (status, headers, body) = call(&app, Method::GET, path, &[]).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(headers[header::CONTENT_TYPE], content_type, "{path}");
        assert!(!body.is_empty(), "{path}");
    }
    let (status, headers, body) = call(&app, Method::GET, "/api/v1/servers", &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
    let agent = [("authorization", "Bearer agent-token-0123456789")];
    let (status, v) = get_json(&app, "/api/v1/servers", &agent).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(v["error"]["code"], "PERMISSION_DENIED");
    let (status, v) = get_json(&app, "/api/v1/servers?bogus=1", &[]).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a stranger is refused before the query string is read: {v}"
    );
    let query = [("authorization", "Bearer query-token-0123456789")];
    let (status, v) = get_json(&app, "/api/v1/servers", &query).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

#[tokio::test]
async fn static_files_are_revalidated_by_their_tag_and_the_page_loads_only_from_this_port() {
    let app = app(stocked(), Auth::default());
    let mut tags = BTreeSet::new();
    for path in [
        "/",
        "/app.js",
        "/style.css",
        "/favicon.svg",
        "/api/v1/openapi.json",
    ] {
        let (status, headers, body) = call(&app, Method::GET, path, &[]).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(headers[header::CACHE_CONTROL], "no-cache", "{path}");
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
        let policy = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
        ] {
            assert!(policy.contains(directive), "{path}: {policy}");
        }
        assert!(!policy.contains("unsafe"), "{path}: {policy}");
        let tag = headers[header::ETAG].to_str().unwrap().to_string();
        assert!(tag.starts_with('"') && tag.ends_with('"'), "{path}: {tag}");
        // The client holds this version: nothing is sent again, the tag is.
        for held in [tag.clone(), format!("\"other\", W/{tag}"), "*".to_string()] {
            let (status, headers, again) =
                call(&app, Method::GET, path, &[("if-none-match", &held)]).await;
            assert_eq!(status, StatusCode::NOT_MODIFIED, "{path} with {held}");
            assert_eq!(headers[header::ETAG], tag.as_str(), "{path}");
            assert!(again.is_empty(), "{path}: a 304 has no body");
        }
        // Another version: the whole file.
        let (status, _, again) =
            call(&app, Method::GET, path, &[("if-none-match", "\"other\"")]).await;
        assert_eq!((status, again), (StatusCode::OK, body), "{path}");
        assert!(tags.insert(tag), "{path}: every file has a tag of its own");
    }
    // The page names its icon, so a browser does not ask for /favicon.ico (a 404).
    let (_, _, page) = call(&app, Method::GET, "/", &[]).await;
    assert!(
        page.contains(r#"<link rel="icon" href="/favicon.svg" type="image/svg+xml">"#),
        "{page}"
    );
}

/// The bytes of a GET of `path` with `headers`: status, headers, body as sent.
async fn get_raw(
    app: &Router,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    call_raw(app, Method::GET, path, headers).await
}

#[tokio::test]
async fn static_files_are_gzipped_for_clients_that_take_gzip_under_a_tag_of_their_own() {
    use std::io::Read;
    let app = app(stocked(), Auth::default());
    for path in ["/", "/app.js", "/style.css", "/api/v1/openapi.json"] {
        let (status, plain_headers, plain) = get_raw(&app, path, &[]).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(
            plain_headers.get(header::CONTENT_ENCODING).is_none(),
            "{path}"
        );
        assert_eq!(plain_headers[header::VARY], "accept-encoding", "{path}");
        // What browsers send, and quality values that do or do not take gzip.
        for accept in [
            "gzip, deflate, br, zstd",
            "br;q=1.0, gzip;q=0.5",
            "*",
            "identity, *;q=0.1",
        ] {
            let (status, headers, zipped) =
                get_raw(&app, path, &[("accept-encoding", accept)]).await;
            assert_eq!(status, StatusCode::OK, "{path} {accept}");
            assert_eq!(headers[header::CONTENT_ENCODING], "gzip", "{path} {accept}");
            assert_eq!(headers[header::VARY], "accept-encoding", "{path}");
            assert!(
                zipped.len() * 2 < plain.len(),
                "{path}: {} of {}",
                zipped.len(),
                plain.len()
            );
            let mut unzipped = Vec::new();
            flate2::read::GzDecoder::new(zipped.as_slice())
                .read_to_end(&mut unzipped)
                .unwrap();
            assert_eq!(unzipped, plain, "{path}: gunzipped, the same bytes");
            // Another representation, another tag; each revalidates by its own.
            let tag = headers[header::ETAG].to_str().unwrap();
            assert_ne!(tag, plain_headers[header::ETAG].to_str().unwrap(), "{path}");
            let (status, _, _) = get_raw(
                &app,
                path,
                &[("accept-encoding", accept), ("if-none-match", tag)],
            )
            .await;
            assert_eq!(status, StatusCode::NOT_MODIFIED, "{path} {accept}");
            let (status, _, body) = get_raw(&app, path, &[("if-none-match", tag)]).await;
            assert_eq!((status, body), (StatusCode::OK, plain.clone()), "{path}");
        }
        for refused in ["identity", "gzip;q=0", "br", "*;q=0", "gzip;q=0, *"] {
            let (_, headers, body) = get_raw(&app, path, &[("accept-encoding", refused)]).await;
            assert!(
                headers.get(header::CONTENT_ENCODING).is_none(),
                "{path} {refused}"
            );
            assert_eq!(body, plain, "{path} {refused}");
        }
    }
}

/// The static files' paths: every route that is not an API route.
fn static_paths() -> Vec<&'static str> {
    let api: BTreeSet<&str> = ROUTES.iter().map(|r| r.path).collect();
    routes()
        .into_iter()
        .map(|(path, _)| path)
        .filter(|path| !api.contains(path))
        .collect()
}

#[tokio::test]
async fn a_head_of_a_static_file_has_the_get_headers_and_no_body() {
    let app = app(stocked(), Auth::default());
    for path in static_paths() {
        for accept in [None, Some("gzip"), Some("identity")] {
            let headers: Vec<(&str, &str)> =
                accept.map(|a| ("accept-encoding", a)).into_iter().collect();
            let (status, got, body) = get_raw(&app, path, &headers).await;
            let (head_status, head, head_body) = call_raw(&app, Method::HEAD, path, &headers).await;
            assert_eq!((head_status, status), (StatusCode::OK, StatusCode::OK));
            assert!(
                head_body.is_empty(),
                "{path} {accept:?}: a HEAD has no body"
            );
            for name in [
                header::CONTENT_TYPE,
                header::CONTENT_ENCODING,
                header::ETAG,
                header::VARY,
            ] {
                assert_eq!(head.get(&name), got.get(&name), "{path} {accept:?}: {name}");
            }
            if let Some(length) = head.get(header::CONTENT_LENGTH) {
                assert_eq!(
                    length.to_str().unwrap(),
                    body.len().to_string(),
                    "{path} {accept:?}: the length of what a GET sends"
                );
            }
        }
    }
}

#[tokio::test]
async fn no_gzip_for_an_accept_encoding_that_does_not_take_it() {
    let app = app(stocked(), Auth::default());
    for path in static_paths() {
        let (_, _, plain) = get_raw(&app, path, &[]).await;
        // An empty field (no coding wanted), gzip at quality 0 however spelt, and a
        // quality that is not a qvalue (RFC 9110, 12.4.2): none says gzip is acceptable.
        for refused in [
            "",
            " GZIP ; Q=0 ",
            "gzip;q=0.000",
            "x-gzip;q=0",
            "gzip;q=0, deflate",
            "deflate, *;q=0",
            "gzip;q=",
            "gzip;q=none",
            "gzip;q=-1",
            "gzip; q = 0",
        ] {
            let (status, headers, body) =
                get_raw(&app, path, &[("accept-encoding", refused)]).await;
            assert_eq!(status, StatusCode::OK, "{path} {refused:?}");
            assert!(
                headers.get(header::CONTENT_ENCODING).is_none(),
                "{path}: {refused:?} does not take gzip"
            );
            assert_eq!(body, plain, "{path} {refused:?}");
        }
        // And whatever takes it, with gzip named or not, gets the gzip representation.
        for taken in [
            "GZIP",
            "x-gzip",
            "gzip;q=0.001",
            "deflate;q=1, *;q=0.5",
            "gzip ;q=1",
        ] {
            let (_, headers, _) = get_raw(&app, path, &[("accept-encoding", taken)]).await;
            assert_eq!(
                headers
                    .get(header::CONTENT_ENCODING)
                    .map(|v| v.to_str().unwrap()),
                Some("gzip"),
                "{path}: {taken:?} takes gzip"
            );
        }
    }
}

#[test]
fn the_openapi_document_says_which_static_files_may_come_gzipped() {
    let doc = document();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let app = app(stocked(), Auth::default());
    for path in static_paths() {
        let (_, headers, _) = runtime.block_on(get_raw(&app, path, &[("accept-encoding", "gzip")]));
        let served = headers.get(header::CONTENT_ENCODING).is_some();
        let documented = doc["paths"][path]["get"]["responses"]["200"]["headers"]
            .get("Content-Encoding")
            .is_some();
        assert_eq!(
            documented, served,
            "{path}: gzipped to a client that takes it, and the document says so"
        );
    }
}
