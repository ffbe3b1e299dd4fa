//! TLS for every gRPC listener and client of hourglass (rustls, ring).
//!
//! Servers take a certificate chain and key (`--tls-cert`, `--tls-key`, PEM) and, for
//! mutual TLS, a CA whose certificates clients must present (`--tls-client-ca`). The
//! certificate and key are read again when either file changes (checked at most once a
//! second, at a handshake), so a renewed certificate takes effect without a restart; a
//! renewal that does not load is logged and the previous certificate stays in use.
//!
//! Clients take the CA that signed the server's certificate (`--tls-ca`) and, for mutual
//! TLS, their own certificate and key. An `https://` URL turns TLS on; `http://` stays
//! plaintext for loopback development.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tonic::codegen::http;

/// TLS material that cannot be used; the message names the file and what is wrong.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct TlsError(String);

/// A server's TLS settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// PEM certificate chain, leaf first.
    pub(crate) cert: PathBuf,
    /// PEM private key.
    pub(crate) key: PathBuf,
    /// PEM CA certificates; when set, clients must present a certificate it signed.
    pub(crate) client_ca: Option<PathBuf>,
}

/// The flags of a TLS server port, shared by `hourglass-aggregator` (gRPC) and
/// `hourglass-agent` (Ingest).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServerTlsFlags {
    /// PEM certificate chain for TLS on the gRPC port (with --tls-key); reloaded when the
    /// file changes. Without it the port is plaintext, for loopback development.
    #[arg(long, env = "HOURGLASS_TLS_CERT")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "HOURGLASS_TLS_KEY")]
    pub(crate) tls_key: Option<PathBuf>,
    /// PEM CA certificates: clients must present a certificate signed by one (mutual TLS).
    #[arg(long, env = "HOURGLASS_TLS_CLIENT_CA")]
    pub(crate) tls_client_ca: Option<PathBuf>,
}

/// The flags of a gRPC client: `hourglass-agent` (to its aggregator) and the `hourglass`
/// command (to an agent or an aggregator). TLS is on for an `https://` address, or for
/// `host:port` when any of the TLS files is given ([`ClientTls::url`]).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientTlsFlags {
    /// PEM CA certificates that signed the server's certificate (TLS is on with it).
    #[arg(long, env = "HOURGLASS_TLS_CA")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// PEM certificate presented to a server that requires mutual TLS.
    #[arg(long, env = "HOURGLASS_TLS_CLIENT_CERT")]
    pub(crate) tls_client_cert: Option<PathBuf>,
    /// PEM key of --tls-client-cert.
    #[arg(long, env = "HOURGLASS_TLS_CLIENT_KEY")]
    pub(crate) tls_client_key: Option<PathBuf>,
    /// A file holding the bearer token for a server that requires one (the token can
    /// also come from the HOURGLASS_TOKEN environment variable; never from a flag).
    #[arg(long, env = "HOURGLASS_TOKEN_FILE")]
    pub(crate) token_file: Option<PathBuf>,
}

impl ClientTlsFlags {
    /// The TLS settings these flags give.
    pub fn settings(&self) -> ClientTls {
        ClientTls {
            ca: self.tls_ca.clone(),
            cert: self.tls_client_cert.clone(),
            key: self.tls_client_key.clone(),
        }
    }

    /// The `authorization` value of the token (from --token-file or the env), made now so that a token
    /// a header cannot carry is one error at start.
    pub fn bearer(
        &self,
    ) -> Result<Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>, TlsError> {
        read_token(self.token_file.as_deref())?
            .map(|token| bearer_header(&token))
            .transpose()
    }
}

impl ServerTlsFlags {
    /// The settings these flags give (see `ServerTls::from_flags`).
    pub fn settings(self) -> Result<Option<ServerTls>, TlsError> {
        ServerTls::from_flags(self.tls_cert, self.tls_key, self.tls_client_ca)
    }

    /// The rustls configuration these flags give to the `port` they secure (`None`:
    /// plaintext), its certificates loaded now, so a bad file is an error at start; the
    /// transport is logged as `{port} transport: …`.
    pub fn server_config(self, port: &str) -> Result<Option<Arc<rustls::ServerConfig>>, TlsError> {
        let tls = self.settings()?;
        let config = tls.as_ref().map(server_config).transpose()?;
        tracing::info!("{port} transport: {}", ServerTls::describe(tls.as_ref()));
        Ok(config)
    }
}

impl ServerTls {
    /// The settings of `--tls-cert`, `--tls-key` and `--tls-client-ca`: `None` for
    /// plaintext, an error if only one of the certificate and key is given, or a client
    /// CA without them.
    pub(crate) fn from_flags(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        client_ca: Option<PathBuf>,
    ) -> Result<Option<ServerTls>, TlsError> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(ServerTls {
                cert,
                key,
                client_ca,
            })),
            (None, None) if client_ca.is_none() => Ok(None),
            (None, None) => Err(TlsError(
                "--tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS first".into(),
            )),
            (Some(_), None) => Err(TlsError("--tls-cert needs --tls-key".into())),
            (None, Some(_)) => Err(TlsError("--tls-key needs --tls-cert".into())),
        }
    }

    /// One line for the log: which mode is in force.
    pub fn describe(tls: Option<&ServerTls>) -> String {
        match tls {
            None => "plaintext (no --tls-cert): for loopback development only".into(),
            Some(ServerTls {
                cert,
                client_ca: None,
                ..
            }) => format!("TLS with {}", cert.display()),
            Some(ServerTls {
                cert,
                client_ca: Some(ca),
                ..
            }) => format!(
                "mutual TLS with {}; clients need a certificate from {}",
                cert.display(),
                ca.display()
            ),
        }
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError(format!("cannot read {what} {}: {e}", path.display())))
}

fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            TlsError(format!(
                "{what} {} is not PEM certificates: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(TlsError(format!(
            "{what} {} holds no certificate",
            path.display()
        )));
    }
    Ok(certs)
}

fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(cert, "certificate")?;
    let key_pem = read(key, "key")?;
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        TlsError(format!(
            "key {} is not a PEM private key: {e}",
            key.display()
        ))
    })?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| TlsError(format!("key {} cannot be used: {e}", key.display())))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        TlsError(format!(
            "certificate {} and key {} do not match: {e}",
            cert.display(),
            key.display()
        ))
    })?;
    Ok(certified)
}

/// The server certificate, read again when its files change.
#[derive(Debug)]
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    state: Mutex<ReloadState>,
}

#[derive(Debug)]
struct ReloadState {
    current: Arc<CertifiedKey>,
    stamp: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
}

/// How often at most the files are looked at.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

impl Reloading {
    fn stamp(&self) -> (Option<SystemTime>, Option<SystemTime>) {
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        (modified(&self.cert), modified(&self.key))
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let stamp = self.stamp();
            if stamp != state.stamp {
                state.stamp = stamp;
                match certified_key(&self.cert, &self.key) {
                    Ok(key) => {
                        tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded");
                        state.current = Arc::new(key);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "TLS certificate changed but does not load; keeping the previous one")
                    }
                }
            }
        }
        Arc::clone(&state.current)
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The rustls configuration of a gRPC server: HTTP/2 by ALPN, the reloading certificate,
/// and client certificates verified against the client CA when one is set.
pub fn server_config(tls: &ServerTls) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let first = certified_key(&tls.cert, &tls.key)?;
    let reloading = Reloading {
        cert: tls.cert.clone(),
        key: tls.key.clone(),
        state: Mutex::new(ReloadState {
            current: Arc::new(first),
            stamp: (None, None),
            checked: Instant::now(),
        }),
    };
    {
        let mut state = reloading.state.lock().expect("fresh lock");
        state.stamp = reloading.stamp();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("TLS setup: {e}")))?;
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(ca, "client CA")? {
                roots
                    .add(cert)
                    .map_err(|e| TlsError(format!("client CA {}: {e}", ca.display())))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError(format!("client CA {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(Arc::new(reloading));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// HTTP/2's flow-control window per stream that [`server`] grants: a whole ingest request
/// or push (up to a few MiB) is sent without waiting for the receiver's window updates.
pub const STREAM_WINDOW: u32 = 4 << 20;
/// HTTP/2's flow-control window per connection that [`server`] grants.
pub const CONNECTION_WINDOW: u32 = 8 << 20;
/// The largest HTTP/2 frame [`server`] accepts: a 100 KB request arrives in one or two
/// frames, not seven of 16 KiB (HTTP/2's default).
pub const MAX_FRAME: u32 = 1 << 20;

/// The gRPC server builder of the agent and the aggregator, with HTTP/2 windows and
/// frames sized for their messages. With HTTP/2's defaults (64 KiB windows, 16 KiB
/// frames), a 1 MiB push waited on 16 window updates, and every frame was a wakeup and
/// a system call on both sides (docs/BENCHMARKS.md, "Ingest CPU"). Messages stay bounded
/// by each service's own size limit, which is checked before any is decoded.
pub fn server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
}

/// How long [`serve_router`] waits for the RPCs in flight once shutdown has begun. tonic
/// waits for every connection to close and bounds none of it: one client holding a stream
/// open (a request half sent, a peer's connection that never closes) kept a node from ever
/// finishing its shutdown. Past it, `serve_router` returns while tonic's connection tasks
/// may still run their handlers until the runtime ends: a server whose shutdown must see
/// no handler after it refuses them itself (the agent's Ingest: `ingest::stop_taking`).
pub const DRAIN: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown` completes, then drains the accepted
/// connections for up to [`DRAIN`]: over TLS when `tls` is given (handshakes as
/// [`incoming`] runs them), else plain TCP with Nagle's algorithm off. The one place the
/// agent and the aggregator start gRPC.
pub async fn serve_router<L, ResBody>(
    router: tonic::transport::server::Router<L>,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    L: tower::Layer<tonic::service::Routes>,
    L::Service: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Future: Send,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Error:
        Into<tonic::codegen::StdError> + Send,
    ResBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    ResBody::Error: Into<tonic::codegen::StdError>,
{
    let (begun, began) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        let _ = begun.send(());
    };
    let serving = async move {
        match tls {
            Some(config) => {
                router
                    .serve_with_incoming_shutdown(incoming(listener, config), shutdown)
                    .await
            }
            None => {
                let plain =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                router.serve_with_incoming_shutdown(plain, shutdown).await
            }
        }
    };
    let drained = async move {
        match began.await {
            Ok(()) => tokio::time::sleep(DRAIN).await,
            // The server ended without a shutdown: `serving` is done.
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        served = serving => served,
        () = drained => {
            tracing::warn!("gRPC requests still in flight {DRAIN:?} after shutdown began; no longer waiting for them");
            Ok(())
        }
    }
}

/// Accepted TLS connections of `listener`, for `serve_with_incoming`: each handshake runs
/// on its own task (a slow client delays nobody) and must finish within 10 s; failed
/// handshakes are logged at a bounded rate and dropped.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> tokio_stream::wrappers::ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        let failures = Arc::new(std::sync::atomic::AtomicU64::new(0));
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                // The server stopped reading connections: stop accepting.
                () = tx.closed() => return,
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx, failures) = (acceptor.clone(), tx.clone(), Arc::clone(&failures));
            tokio::spawn(async move {
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    outcome => {
                        let n = failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        // The first ten, then every thousandth: a scanner cannot flood the log.
                        if n < 10 || n % 1000 == 0 {
                            let why = match outcome {
                                Ok(Err(e)) => e.to_string(),
                                _ => "handshake took longer than 10 s".into(),
                            };
                            tracing::warn!(%peer, error = %why, failed_handshakes = n + 1, "TLS handshake failed");
                        }
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// A client's TLS settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM CA certificates that signed the server's certificate.
    pub ca: Option<PathBuf>,
    /// PEM client certificate, for mutual TLS.
    pub cert: Option<PathBuf>,
    /// PEM client key, for mutual TLS.
    pub key: Option<PathBuf>,
}

impl ClientTls {
    /// The URL for `address`, which is a URL (`http://host:port`, `https://host:port`)
    /// or, as grpcurl and most gRPC tools take it, `host:port`: that means `https://`
    /// when TLS files are given and `http://` otherwise.
    pub fn url(&self, address: &str) -> String {
        if address.contains("://") {
            return address.to_string();
        }
        let scheme = if self.ca.is_some() || self.cert.is_some() || self.key.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{address}")
    }

    /// The tonic endpoint for `address` (a URL or `host:port`, see [`ClientTls::url`]):
    /// TLS for `https://` (with the CA and the client identity given), plaintext for
    /// `http://`. An error names what does not fit.
    pub fn endpoint(&self, address: &str) -> Result<tonic::transport::Endpoint, TlsError> {
        let url = &self.url(address)[..];
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(TlsError(format!(
                "{address:?}: give host:port, http://host:port or https://host:port"
            )));
        }
        // Without a scheme the port is required: `agg` alone would quietly mean port 80.
        if !address.contains("://")
            && !address
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
        {
            return Err(TlsError(format!(
                "{address:?} has no port: give host:port, http://host:port or https://host:port"
            )));
        }
        let endpoint = tonic::transport::Endpoint::from_shared(url.to_string()).map_err(|_| {
            TlsError(format!(
                "{address:?} is not an address: give host:port, http://host:port or https://host:port"
            ))
        })?;
        if endpoint.uri().host().is_none_or(str::is_empty) {
            return Err(TlsError(format!(
                "{address:?} names no host: give host:port, http://host:port or https://host:port"
            )));
        }
        let https = url.starts_with("https://");
        if !https {
            if self.ca.is_some() || self.cert.is_some() || self.key.is_some() {
                return Err(TlsError(format!(
                    "TLS files were given but {url} is plaintext: use an https:// URL"
                )));
            }
            return Ok(endpoint);
        }
        let mut config = tonic::transport::ClientTlsConfig::new();
        match &self.ca {
            Some(ca) => {
                let pem = read(ca, "CA")?;
                config = config.ca_certificate(tonic::transport::Certificate::from_pem(pem));
            }
            None => {
                return Err(TlsError(format!(
                    "{url} is TLS: give the CA that signed its certificate (--tls-ca)"
                )));
            }
        }
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                config = config.identity(tonic::transport::Identity::from_pem(
                    read(cert, "client certificate")?,
                    read(key, "client key")?,
                ));
            }
            (None, None) => {}
            _ => {
                return Err(TlsError(
                    "a client certificate needs its key, and a key its certificate".into(),
                ));
            }
        }
        endpoint
            .tls_config(config)
            .map_err(|e| TlsError(format!("TLS setup for {url}: {e}")))
    }
}

/// The bearer token of a client: the contents of `file` if given (surrounding whitespace
/// trimmed), else the `HOURGLASS_TOKEN` environment variable, else none. Tokens never come
/// from a command-line flag, where `ps` would show them.
pub(crate) fn read_token(file: Option<&Path>) -> Result<Option<String>, TlsError> {
    let token = match file {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
            TlsError(format!(
                "cannot read the token file {}: {e}",
                path.display()
            ))
        })?),
        None => std::env::var("HOURGLASS_TOKEN").ok(),
    };
    Ok(token
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty()))
}

/// The `authorization` value that carries `token`: `Bearer TOKEN`, the one form every
/// client of hourglass sends; an error if the token has characters a header cannot carry.
pub fn bearer_header(
    token: &str,
) -> Result<tonic::metadata::MetadataValue<tonic::metadata::Ascii>, TlsError> {
    format!("Bearer {token}")
        .parse()
        .map_err(|_| TlsError("the token has characters an HTTP header cannot carry".into()))
}

/// The token an `authorization` value carries, if it has the form [`bearer_header`] makes.
pub fn bearer_token(header: &[u8]) -> Option<&[u8]> {
    header.strip_prefix(b"Bearer ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_headers_read_back_and_refuse_what_a_header_cannot_carry() {
        let header = bearer_header("s3cret").unwrap();
        assert_eq!(bearer_token(header.as_bytes()), Some(&b"s3cret"[..]));
        assert_eq!(bearer_token(b"Basic s3cret"), None);
        assert!(bearer_header("line\nbreak").is_err());
    }

    #[test]
    fn flags_must_come_in_pairs() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(ServerTls::from_flags(None, None, None).unwrap(), None);
        assert!(
            ServerTls::from_flags(p("c"), p("k"), p("ca"))
                .unwrap()
                .is_some()
        );
        for (c, k, ca) in [
            (p("c"), None, None),
            (None, p("k"), None),
            (None, None, p("ca")),
        ] {
            assert!(ServerTls::from_flags(c, k, ca).is_err());
        }
        let plain = ClientTls::default();
        assert!(plain.endpoint("http://127.0.0.1:1").is_ok());
        let e = plain
            .endpoint("https://127.0.0.1:1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--tls-ca"), "{e}");
        let with_ca = ClientTls {
            ca: p("ca.pem"),
            ..ClientTls::default()
        };
        assert!(
            with_ca
                .endpoint("http://127.0.0.1:1")
                .unwrap_err()
                .to_string()
                .contains("https://")
        );
    }

    #[test]
    fn host_port_means_http_or_https_by_the_tls_flags() {
        let plain = ClientTls::default();
        assert_eq!(plain.url("127.0.0.1:7710"), "http://127.0.0.1:7710");
        assert_eq!(plain.url("agg.example:7700"), "http://agg.example:7700");
        assert_eq!(plain.url("[::1]:7700"), "http://[::1]:7700");
        assert_eq!(plain.url("https://a:1"), "https://a:1");
        assert!(plain.endpoint("127.0.0.1:7710").is_ok());
        assert_eq!(
            plain.endpoint("[::1]:7700").unwrap().uri().to_string(),
            "http://[::1]:7700/"
        );
        let with_ca = ClientTls {
            ca: Some(PathBuf::from("ca.pem")),
            ..ClientTls::default()
        };
        assert_eq!(with_ca.url("agg:7700"), "https://agg:7700");
        let key_only = ClientTls {
            key: Some(PathBuf::from("client.key")),
            ..ClientTls::default()
        };
        assert_eq!(key_only.url("agg:7700"), "https://agg:7700");
        assert!(key_only.endpoint("http://agg:7700").is_err());
        // The https:// it implies needs the CA file: the error is about reading it, not
        // about the URL's form.
        let e = with_ca.endpoint("agg:7700").unwrap_err().to_string();
        assert!(e.contains("ca.pem"), "{e}");
        for bad in [
            "",
            "ftp://a:1",
            "http://",
            "a b:1",
            "agg",
            ":7700",
            "agg:port",
            "[::1]",
        ] {
            let e = plain.endpoint(bad).unwrap_err().to_string();
            assert!(e.contains("host:port"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn unreadable_or_mismatched_material_is_named() {
        let dir = std::env::temp_dir().join(format!("hourglass-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let b = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let cert = write("a.pem", &a.cert.pem());
        let key = write("a.key", &a.signing_key.serialize_pem());
        let other_key = write("b.key", &b.signing_key.serialize_pem());
        let garbage = write("garbage.pem", "not pem at all");
        let tls = |cert: &Path, key: &Path| ServerTls {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            client_ca: None,
        };
        assert!(server_config(&tls(&cert, &key)).is_ok());
        let e = server_config(&tls(&cert, &other_key))
            .unwrap_err()
            .to_string();
        assert!(e.contains("do not match"), "{e}");
        let e = server_config(&tls(&garbage, &key)).unwrap_err().to_string();
        assert!(e.contains("garbage.pem"), "{e}");
        let e = server_config(&tls(&dir.join("missing.pem"), &key))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read certificate"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
