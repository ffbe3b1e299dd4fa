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
    let tag = entity_tag(body);
    get(move |headers: axum::http::HeaderMap| async move {
        static_file(body, content_type, &tag, &headers)
    })
}

/// The entity tag of a static file: a hash of its bytes, so that it changes with them
/// (a new build) and only then.
fn entity_tag(body: &str) -> HeaderValue {
    let tag = format!("\"{:016x}\"", xxhash_rust::xxh3::xxh3_64(body.as_bytes()));
    HeaderValue::from_str(&tag).expect("hex digits in quotes are a header value")
}

/// A static file, or `304 Not Modified` when the client already holds this version
/// (`If-None-Match` names its tag): browsers revalidate on every load (`no-cache`) and
/// fetch the bytes again only after an upgrade changed them.
fn static_file(
    body: &'static str,
    content_type: &'static str,
    tag: &HeaderValue,
    request: &axum::http::HeaderMap,
) -> Response {
    let held = request
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(str::trim))
        .any(|t| t == "*" || t.trim_start_matches("W/").as_bytes() == tag.as_bytes());
    let mut response = if held {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, content_type)], body).into_response()
    };
    let headers = response.headers_mut();
    headers.insert(header::ETAG, tag.clone());
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
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
