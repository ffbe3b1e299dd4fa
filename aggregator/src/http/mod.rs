//! The HTTP port: the JSON query API under `/api/v1/` and the dashboard that uses it.
//!
//! The API asks the questions of the gRPC `Query` service, over plain `GET`s with
//! query-string parameters (`/api/v1/distinct?metric=visitors&from=-7d&group_by=day`), for
//! browsers, `curl` and anything else that speaks JSON rather than gRPC. It is not a
//! second query path: every handler calls the very `QueryService` methods the gRPC
//! server calls, with a `tonic::Request` carrying the caller's headers, so the service's
//! checks, limits, metrics, traces and cluster fan-out are the same; the handlers only
//! read the query string ([`hourglass_rpc::selection`], as `hourglass query` reads its
//! flags) and write the reply as JSON (`api`). The routes, parameters and answers are
//! described by the OpenAPI document served at `/api/v1/openapi.json`, kept beside this
//! file; a unit test holds it to the routes served.
//!
//! The port serves TLS with the gRPC port's certificate (and its client-certificate
//! requirement) when that has one, and checks bearer tokens (`Authorization: Bearer
//! TOKEN`) and client certificates with the very check that guards the gRPC `Query`
//! service (`Auth::check`).
//! The dashboard's static files (`/`, `/app.js`, `/style.css`, `/favicon.svg`) and the
//! OpenAPI document need no token: they hold no data, and the page sends the token it is
//! given. They carry an entity tag (a client that holds the version answers `304`), a
//! Content-Security-Policy that lets the page load only from this port, and `nosniff`.
//!
//! Every failure is JSON, `{"error": {"code": "NOT_FOUND", "message": "…"}}`, with the
//! gRPC code's name and its exact message, and the HTTP status of that code; a bad query
//! string, an unknown path and a wrong method too.

pub(crate) mod api;
pub(crate) mod error;
pub(crate) mod server;
pub(crate) mod state;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::StreamExt;
use tonic::transport::server::{Connected as TonicConnected, TcpConnectInfo};

use error::{ApiError, JSON};
pub(crate) use state::HttpState;
use state::Peer;

/// The OpenAPI 3 document of every route this port serves.
pub(crate) const OPENAPI: &str = include_str!("openapi.json");

/// Serves the API and the dashboard on `listener` until `shutdown` completes, then
/// finishes the requests in flight. With `tls` (the gRPC port's configuration), it
/// serves HTTPS with the same certificate and client-certificate requirement.
pub(crate) async fn serve(
    listener: TcpListener,
    state: HttpState,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let connections = match tls {
        None => Connections::Plain(listener),
        Some(grpc) => {
            let local = listener.local_addr()?;
            // The gRPC configuration offers only HTTP/2 by ALPN; this port speaks HTTP/1.1.
            // The certificate resolver (reloading on change) and the client verifier are
            // shared.
            let mut config = (*grpc).clone();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Connections::Tls {
                local,
                handshakes: hourglass_rpc::tls::incoming(listener, Arc::new(config)),
            }
        }
    };
    server::serve(connections, router(Arc::new(state)), shutdown).await
}

/// Every route: its path and what answers it. The router is built from this list, and the
/// OpenAPI test compares the list with the document.
fn routes() -> Vec<(&'static str, MethodRouter<Arc<HttpState>>)> {
    let mut routes = vec![
        (
            "/",
            static_route(include_str!("dashboard/index.html"), HTML),
        ),
        (
            "/app.js",
            static_route(include_str!("dashboard/app.js"), "text/javascript"),
        ),
        (
            "/style.css",
            static_route(include_str!("dashboard/style.css"), "text/css"),
        ),
        (
            "/favicon.svg",
            static_route(include_str!("dashboard/favicon.svg"), "image/svg+xml"),
        ),
        ("/api/v1/openapi.json", static_route(OPENAPI, JSON)),
    ];
    routes.extend(api::routes());
    routes
}

/// The routes, and JSON answers for paths and methods they do not serve.
pub(crate) fn router(state: Arc<HttpState>) -> Router {
    routes()
        .into_iter()
        .fold(Router::new(), |router, (path, method)| {
            router.route(path, method)
        })
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .with_state(state)
}

/// The content type of the dashboard page.
const HTML: &str = "text/html; charset=utf-8";

/// What the dashboard's page may load and run: its own script, style sheet and icon, and
/// requests to this port (the API); nothing from elsewhere, no inline script or style,
/// and no framing by another site.
const PAGE_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// A route serving `body`, a file compiled into the binary, with its entity tag.
fn static_route<S: Clone + Send + Sync + 'static>(
    body: &'static str,
    content_type: &'static str,
) -> MethodRouter<S> {
    let file = Arc::new(StaticFile::new(body, content_type));
    get(move |headers: axum::http::HeaderMap| async move { file.response(&headers) })
}

/// A file built into the binary, served as is or gzipped (made once, at start-up).
struct StaticFile {
    body: &'static str,
    content_type: &'static str,
    /// Its entity tag ([`entity_tag`]).
    tag: HeaderValue,
    /// The gzipped bytes and their own tag (another representation has another tag), or
    /// `None` where gzip would not make it smaller.
    gzipped: Option<(axum::body::Bytes, HeaderValue)>,
}

impl StaticFile {
    fn new(body: &'static str, content_type: &'static str) -> StaticFile {
        let tag = entity_tag(body, "");
        let gzipped = gzip(body.as_bytes())
            .filter(|zipped| zipped.len() < body.len())
            .map(|zipped| (axum::body::Bytes::from(zipped), entity_tag(body, "-gzip")));
        StaticFile {
            body,
            content_type,
            tag,
            gzipped,
        }
    }

    /// The file, gzipped when the client accepts it, or `304 Not Modified` when the
    /// client already holds this version (`If-None-Match` names its tag): browsers
    /// revalidate on every load (`no-cache`) and fetch the bytes again only after an
    /// upgrade changed them.
    fn response(&self, request: &axum::http::HeaderMap) -> Response {
        let zipped = self.gzipped.as_ref().filter(|_| accepts_gzip(request));
        let tag = zipped.map_or(&self.tag, |(_, tag)| tag);
        let held = request
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(',').map(str::trim))
            .any(|t| t == "*" || t.trim_start_matches("W/").as_bytes() == tag.as_bytes());
        let content_type = [(header::CONTENT_TYPE, self.content_type)];
        let mut response = match zipped {
            _ if held => StatusCode::NOT_MODIFIED.into_response(),
            Some((bytes, _)) => (
                content_type,
                [(header::CONTENT_ENCODING, "gzip")],
                bytes.clone(),
            )
                .into_response(),
            None => (content_type, self.body).into_response(),
        };
        let headers = response.headers_mut();
        headers.insert(header::ETAG, tag.clone());
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        // Caches keep the gzipped and the plain bytes apart.
        if self.gzipped.is_some() {
            headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
        }
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(PAGE_POLICY),
        );
        response
    }
}

/// The entity tag of a static file: a hash of its bytes, so that it changes with them
/// (a new build) and only then; `suffix` tells its representations apart.
fn entity_tag(body: &str, suffix: &str) -> HeaderValue {
    let tag = format!(
        "\"{:016x}{suffix}\"",
        xxhash_rust::xxh3::xxh3_64(body.as_bytes())
    );
    HeaderValue::from_str(&tag).expect("hex digits in quotes are a header value")
}

/// `bytes` gzipped at the best compression (once per file, at start-up).
fn gzip(bytes: &[u8]) -> Option<Vec<u8>> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).ok()?;
    encoder.finish().ok()
}

/// Whether the request's `Accept-Encoding` takes gzip: `gzip` (or `x-gzip`, or `*` when
/// gzip is not named) with a quality above 0 (RFC 9110, 12.5.3).
fn accepts_gzip(request: &axum::http::HeaderMap) -> bool {
    let mut named = None;
    let mut any = None;
    let codings = request
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for coding in codings {
        let mut parts = coding.split(';');
        let name = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let quality = quality(parts);
        match name.as_str() {
            "gzip" | "x-gzip" => named = Some(named.unwrap_or(0.0f32).max(quality)),
            "*" => any = Some(quality),
            _ => {}
        }
    }
    named.or(any).is_some_and(|q| q > 0.0)
}

/// The weight of one `Accept-Encoding` element, from its parameters: its `q`, 1 without
/// one. A `q` that is not a quality from 0 to 1 (`q=`, `q=none`) counts as 0: it does not
/// say that the coding is acceptable.
fn quality<'a>(parameters: impl Iterator<Item = &'a str>) -> f32 {
    for parameter in parameters {
        let Some((name, value)) = parameter.split_once('=') else {
            continue;
        };
        if name.trim().eq_ignore_ascii_case("q") {
            return match value.trim().parse::<f32>() {
                Ok(q) if (0.0..=1.0).contains(&q) => q,
                _ => 0.0,
            };
        }
    }
    1.0
}

async fn not_found(request: axum::extract::Request) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        format!(
            "no such path: {}; the API's routes are in /api/v1/openapi.json",
            request.uri().path()
        ),
    )
    .into_response()
}

async fn method_not_allowed(request: axum::extract::Request) -> Response {
    let mut response = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "UNIMPLEMENTED",
        format!(
            "{} {}: this API answers GET only",
            request.method(),
            request.uri().path()
        ),
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    response
}

/// A stream a connection can be served over.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// The port's connections, plain or after their TLS handshake.
enum Connections {
    Plain(TcpListener),
    Tls {
        local: SocketAddr,
        /// Handshakes run as the gRPC port runs them ([`hourglass_rpc::tls::incoming`]).
        handshakes: tokio_stream::wrappers::ReceiverStream<
            std::io::Result<tokio_rustls::server::TlsStream<TcpStream>>,
        >,
    },
}

impl Listener for Connections {
    type Io = Box<dyn Stream>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self {
            Connections::Plain(listener) => loop {
                match TcpListener::accept(listener).await {
                    Ok((tcp, _)) => {
                        let _ = tcp.set_nodelay(true);
                        let info = tcp.connect_info();
                        return (Box::new(tcp), Peer::Plain(info));
                    }
                    Err(e) => {
                        // Out of file descriptors, usually: wait rather than spin.
                        tracing::warn!(error = %e, "accepting an HTTP connection failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
            },
            Connections::Tls { handshakes, .. } => loop {
                match handshakes.next().await {
                    Some(Ok(tls)) => {
                        let info = tls.connect_info();
                        return (Box::new(tls), Peer::Tls(info));
                    }
                    // A failed handshake is logged where it ran.
                    Some(Err(_)) => {}
                    None => std::future::pending::<()>().await,
                }
            },
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        let local = match self {
            Connections::Plain(listener) => listener.local_addr()?,
            Connections::Tls { local, .. } => *local,
        };
        Ok(Peer::Plain(TcpConnectInfo {
            local_addr: Some(local),
            remote_addr: None,
        }))
    }
}

#[cfg(test)]
mod dashboard_tests;
#[cfg(test)]
mod server_tests;
#[cfg(test)]
pub(crate) mod tests;
