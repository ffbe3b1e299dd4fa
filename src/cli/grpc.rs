//! Connecting to a server's gRPC port: its address by default, TLS and the token, and an
//! error a person can act on when it cannot be reached.

use anyhow::Context;

/// The default aggregator address, where `hourglass-aggregator` listens by default.
pub(crate) const DEFAULT_AGGREGATOR: &str = "http://127.0.0.1:7700";

/// An error and its causes on one line: `transport error: Connection refused (os error 111)`.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

/// TLS and the token for a gRPC connection ([`hourglass_rpc::tls::ClientTlsFlags`]).
pub(crate) type TlsArgs = hourglass_rpc::tls::ClientTlsFlags;

/// An interceptor that adds `authorization: Bearer TOKEN` to every call when a token is
/// given (from --token-file, else HOURGLASS_TOKEN), and the caller's trace context.
pub(crate) fn auth(
    flags: &TlsArgs,
) -> anyhow::Result<
    impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone,
> {
    let header = flags.bearer()?;
    Ok(move |mut request: tonic::Request<()>| {
        if let Some(h) = &header {
            request.metadata_mut().insert("authorization", h.clone());
        }
        // The caller's trace context, when traces are exported.
        hourglass_rpc::process::inject_context(request.metadata_mut());
        Ok(request)
    })
}

/// Connects to the gRPC server at `url` (the `what` named by `flag`), over TLS for
/// `https://`, with an error a person can act on.
pub(crate) async fn connect(
    url: &str,
    what: &str,
    flag: &str,
    tls: &TlsArgs,
) -> anyhow::Result<tonic::transport::Channel> {
    let endpoint = tls
        .settings()
        .endpoint(url)
        .with_context(|| flag.to_string())?
        .connect_timeout(std::time::Duration::from_secs(5));
    endpoint
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the {what} at {url}: {}", error_chain(&e)))
}
