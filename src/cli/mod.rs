//! The `hourglass` command's subcommands.

mod demo;
mod health;
mod numbers;
mod query;
mod send;
mod simulate;
mod sketch;

use clap::{Parser, Subcommand};

/// hourglass: count distinct things, frequencies and membership across a fleet, with the
/// error bar beside every number.
#[derive(Debug, Parser)]
#[command(name = "hourglass", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// See it work: an aggregator, a fleet of agents and a week of synthetic traffic on
    /// this machine, with every answer beside the exact truth. Leaves the aggregator
    /// running for `hourglass query` until Ctrl-C (or stops with --exit).
    Demo(demo::DemoArgs),
    /// Build, merge and inspect sketches as files: count distinct lines of a huge log in
    /// kilobytes, merge sketches another machine made, debug exported sketches.
    #[command(subcommand)]
    Sketch(sketch::SketchCommand),
    /// Ask an aggregator: distinct counts, frequencies, top K or membership over any time
    /// range and any servers, each with its error bar.
    ///
    /// Example: `hourglass query distinct --metric visitors --from -7d --label region=eu`
    Query(query::QueryArgs),
    /// Send events to an agent by hand: items as arguments or one per line of a file.
    ///
    /// Example: `hourglass send visitors user42 user43 --tag country=de`
    Send(send::SendArgs),
    /// Drive agents with deterministic synthetic traffic (Zipf users and pages, overlapping
    /// across servers and days) and write the exact answers.
    ///
    /// Example: `hourglass simulate --spawn 5 --days 7 --events-per-hour 2000 --truth truth.json`
    Simulate(simulate::SimulateArgs),
    /// Ask a server's admin port whether it is healthy (exit status 0 on HTTP 200): the
    /// container image's health check, which has no curl.
    ///
    /// Example: `hourglass health --admin 127.0.0.1:7701 --path /readyz`
    Health(health::HealthArgs),
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Sketch(cmd) => sketch::run(cmd),
        Command::Query(args) => query::run(args),
        Command::Send(args) => send::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Health(args) => health::run(args),
    }
}

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

/// TLS for a gRPC connection: needed when the URL is `https://`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// PEM CA certificates that signed the server's certificate (for https:// URLs).
    #[arg(long, env = "HOURGLASS_TLS_CA")]
    tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate, for servers that require mutual TLS.
    #[arg(long, env = "HOURGLASS_TLS_CLIENT_CERT")]
    tls_client_cert: Option<std::path::PathBuf>,
    /// PEM key of --tls-client-cert.
    #[arg(long, env = "HOURGLASS_TLS_CLIENT_KEY")]
    tls_client_key: Option<std::path::PathBuf>,
    /// A file holding the bearer token for servers that require one (the token itself can
    /// also come from the HOURGLASS_TOKEN environment variable; never from a flag).
    #[arg(long, env = "HOURGLASS_TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,
}

impl TlsArgs {
    /// An interceptor that adds `authorization: Bearer TOKEN` to every call when a token
    /// is given (from --token-file, else HOURGLASS_TOKEN).
    fn auth(
        &self,
    ) -> anyhow::Result<
        impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone,
    > {
        let token = hourglass::tls::read_token(self.token_file.as_deref())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let header = token
            .map(|t| {
                format!("Bearer {t}")
                    .parse::<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>()
                    .map_err(|_| anyhow::anyhow!("the token has characters a header cannot carry"))
            })
            .transpose()?;
        Ok(move |mut request: tonic::Request<()>| {
            if let Some(h) = &header {
                request.metadata_mut().insert("authorization", h.clone());
            }
            // The caller's trace context, when traces are exported.
            hourglass::process::inject_context(request.metadata_mut());
            Ok(request)
        })
    }

    fn client(&self) -> hourglass::tls::ClientTls {
        hourglass::tls::ClientTls {
            ca: self.tls_ca.clone(),
            cert: self.tls_client_cert.clone(),
            key: self.tls_client_key.clone(),
        }
    }
}

/// Connects to the gRPC server at `url` (the `what` named by `flag`), over TLS for
/// `https://`, with an error a person can act on.
async fn connect(
    url: &str,
    what: &str,
    flag: &str,
    tls: &TlsArgs,
) -> anyhow::Result<tonic::transport::Channel> {
    let endpoint = tls
        .client()
        .endpoint(url)
        .map_err(|e| anyhow::anyhow!("{flag}: {e}"))?
        .connect_timeout(std::time::Duration::from_secs(5));
    endpoint
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the {what} at {url}: {}", error_chain(&e)))
}
