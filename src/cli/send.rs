//! `hourglass send`: events to an agent's gRPC `Ingest` service, for trying hourglass by
//! hand and for scripts.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use hourglass_rpc::proto::v1::{self, ingest_client::IngestClient};
use hourglass_rpc::series::{parse_pair, validate_metric};
use hourglass_rpc::time::parse_time;

/// The default agent address, where `hourglass-agent` serves Ingest by default.
pub(crate) const DEFAULT_AGENT: &str = "http://127.0.0.1:7710";
/// Events per Ingest call.
const BATCH: usize = 10_000;

#[derive(Debug, Args)]
pub(crate) struct SendArgs {
    #[command(flatten)]
    tls: super::grpc::TlsArgs,
    /// The agent's gRPC Ingest address: `host:port` (http://, or https:// when --tls-ca
    /// or --tls-client-cert is given), or a URL `http://host:port` / `https://host:port`.
    #[arg(long, env = "HOURGLASS_AGENT", default_value = DEFAULT_AGENT)]
    agent: String,
    /// The metric, such as `visitors`.
    metric: String,
    /// Items to send, one event each.
    items: Vec<String>,
    /// A tag of the series, `key=value` (repeat for more).
    #[arg(long = "tag", value_parser = parse_tag)]
    tags: Vec<(String, String)>,
    /// When the events happened: RFC 3339, a date, `now`, or relative (`-2h`). Default:
    /// now, as the agent's clock reads on arrival.
    #[arg(long)]
    time: Option<String>,
    /// How many occurrences each event stands for (frequency sketches).
    #[arg(long, default_value_t = 1)]
    weight: u64,
    /// Also send one item per line of this file (`-` for standard input); empty lines
    /// are skipped.
    #[arg(long)]
    file: Option<PathBuf>,
}

fn parse_tag(text: &str) -> Result<(String, String), String> {
    parse_pair(text).map_err(|e| e.to_string())
}

/// Sends the events and reports what the agent accepted; exits non-zero if it rejected
/// any.
pub fn run(args: SendArgs) -> anyhow::Result<()> {
    validate_metric(&args.metric)?;
    if args.items.is_empty() && args.file.is_none() {
        bail!("nothing to send: give items after the metric, or --file F");
    }
    if args.weight == 0 {
        bail!("--weight must be at least 1");
    }
    let time = match &args.time {
        Some(t) => parse_time(t, chrono::Utc::now())?.timestamp(),
        None => 0,
    };
    let mut items: Vec<Vec<u8>> = args.items.iter().map(|i| i.clone().into_bytes()).collect();
    if let Some(path) = &args.file {
        items.extend(read_lines(path)?);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let outcome = runtime.block_on(send_all(&args, &items, time))?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "sent {} events to {}: {} accepted, {} rejected",
        items.len(),
        args.agent,
        outcome.accepted,
        outcome.rejected
    )?;
    for r in &outcome.reasons {
        writeln!(out, "  rejected {r}")?;
    }
    if outcome.rejected > 0 {
        bail!(
            "the agent rejected {} of {} events",
            outcome.rejected,
            items.len()
        );
    }
    // An agent that predates `packed_items` reads none of them and answers 0 and 0.
    let counted = outcome.accepted + outcome.rejected;
    if counted != items.len() as u64 {
        bail!(
            "the agent counted {counted} of {} events sent (an agent older than this command ignores SeriesBatch.packed_items: upgrade it)",
            items.len()
        );
    }
    Ok(())
}

/// The non-empty lines of `path` (`-`: stdin) as items, without their line ends.
fn read_lines(path: &std::path::Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?,
        ))
    };
    let mut items = Vec::new();
    for line in reader.split(b'\n') {
        let mut line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if !line.is_empty() {
            items.push(line);
        }
    }
    Ok(items)
}

/// What the agent said of the events sent.
struct Outcome {
    accepted: u64,
    rejected: u64,
    /// The first ten rejections, `item N: reason` (N counted from 1 over all items).
    reasons: Vec<String>,
}

/// Sends `items` at `time` in batches of [`BATCH`], with progress on a terminal.
async fn send_all(args: &SendArgs, items: &[Vec<u8>], time: i64) -> anyhow::Result<Outcome> {
    let tags: Vec<v1::Tag> = args
        .tags
        .iter()
        .map(|(key, value)| v1::Tag {
            key: key.clone(),
            value: value.clone(),
        })
        .collect();
    let channel = super::grpc::connect(&args.agent, "agent", "--agent", &args.tls).await?;
    let mut client = IngestClient::with_interceptor(channel, super::grpc::auth(&args.tls)?)
        .send_compressed(tonic::codec::CompressionEncoding::Zstd)
        .max_encoding_message_size(256 << 20);
    let mut outcome = Outcome {
        accepted: 0,
        rejected: 0,
        reasons: Vec::new(),
    };
    let mut sent = 0usize;
    let progress = items.len() > 10 * BATCH && std::io::IsTerminal::is_terminal(&std::io::stderr());
    for (n, chunk) in items.chunks(BATCH).enumerate() {
        let batch = v1::SeriesBatch {
            metric: args.metric.clone(),
            tags: tags.clone(),
            // One field for the chunk: the agent reads its items as slices, without an
            // allocation each.
            packed_items: hourglass_rpc::packed::pack(chunk.iter().map(Vec::as_slice)).into(),
            times_unix_seconds: vec![time],
            weights: vec![args.weight],
            ..Default::default()
        };
        let reply = client
            .send(v1::IngestRequest {
                events: Vec::new(),
                batches: vec![batch],
            })
            .await
            .map_err(|s| anyhow::anyhow!("the agent at {} answered: {}", args.agent, s.message()))?
            .into_inner();
        outcome.accepted += reply.accepted;
        outcome.rejected += reply.rejected;
        for r in reply.rejected_events {
            if outcome.reasons.len() < 10 {
                outcome.reasons.push(format!(
                    "item {}: {}",
                    n * BATCH + r.index as usize + 1,
                    r.reason
                ));
            }
        }
        sent += chunk.len();
        if progress {
            eprint!("\rsent {sent} of {} events", items.len());
        }
    }
    if progress {
        eprintln!();
    }
    Ok(outcome)
}
