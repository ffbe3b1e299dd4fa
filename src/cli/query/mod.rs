//! `hourglass query distinct | frequency | topk | membership`: questions to an aggregator.
//!
//! The `--json` keys are the ones `hourglass sketch inspect --json` prints, plus
//! `sketches_merged`, `server_hours_missing`, `partitions_missing` (cluster mode) and,
//! when grouped, `groups`.

mod answer;
mod args;
mod sets;

use anyhow::{Context, bail};
use hourglass_rpc::proto::v1::{self, query_client::QueryClient};
use serde_json::{Value, json};
use std::io::Write;

use crate::cli::grpc::{auth, connect};
pub(crate) use answer::distinct_text;
use answer::{Reply, present, strip_text_only_fields};
pub(crate) use args::QueryArgs;
use args::{Question, b_selector, check_flags, describe_selection, question_name, selector};

pub fn run(args: QueryArgs) -> anyhow::Result<()> {
    // One "now" for every relative time of the question, A's and B's alike.
    let now = chrono::Utc::now();
    let selector = selector(&args, now)?;
    let period_hours = check_flags(
        args.question,
        &args.vs,
        args.period.as_deref(),
        args.selection.group_by.is_some(),
    )?;
    let b = match args.question {
        Question::Overlap => Some(b_selector(&args, now)?),
        _ => None,
    };
    let items = match (args.question, args.item.len()) {
        (Question::Frequency | Question::Membership, 0) => {
            bail!("query {} needs --item X", question_name(args.question))
        }
        (Question::Frequency, 2..) => {
            bail!("query frequency takes one --item (query membership takes many)")
        }
        (Question::Distinct | Question::Topk | Question::Overlap | Question::Retention, 1..) => {
            bail!(
                "--item does not apply to query {}",
                question_name(args.question)
            )
        }
        _ => args.item.clone(),
    };
    // A worker thread of its own lets the trace exporter, when configured, flush after
    // the answer is in.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let telemetry = {
        let _entered = runtime.enter();
        hourglass_rpc::process::init_client_tracing("hourglass")
    };
    let span = tracing::info_span!(
        "hourglass query",
        question = question_name(args.question),
        metric = args.selection.metric.as_str()
    );
    let answer = runtime.block_on(tracing::Instrument::instrument(
        ask(&args, selector, b, period_hours, &items),
        span,
    ));
    drop(telemetry);
    let (mut value, text) = answer?;
    let mut out = std::io::stdout().lock();
    if args.json {
        finish_json(&mut value, args.question);
        writeln!(out, "{value}")?;
    } else {
        write!(out, "{text}")?;
    }
    Ok(())
}

/// An answer's JSON as `--json` prints it: the sketch kind asked about, and none of the
/// fields only the text uses.
fn finish_json(value: &mut Value, question: Question) {
    value["kind"] = json!(match question {
        Question::Distinct | Question::Overlap | Question::Retention => "distinct",
        Question::Frequency | Question::Topk => "frequency",
        Question::Membership => "membership",
    });
    strip_text_only_fields(value);
}

/// Turns a gRPC failure into one line a person can act on. UNAVAILABLE is either the
/// connection failing under the call (the status carries the transport's error) or the
/// aggregator itself refusing for now (a cluster node that cannot confirm it holds every
/// acknowledged push): only the first is "cannot reach" (the connection was made before
/// the call, [`connect`]).
fn explain(status: tonic::Status, aggregator: &str) -> anyhow::Error {
    match status.code() {
        tonic::Code::Unavailable if std::error::Error::source(&status).is_some() => {
            anyhow::anyhow!(
                "lost the connection to the aggregator at {aggregator}: {}",
                status.message()
            )
        }
        tonic::Code::Unavailable => anyhow::anyhow!(
            "the aggregator at {aggregator} cannot answer now (retry, or ask another node): {}",
            status.message()
        ),
        _ => anyhow::anyhow!("the aggregator answered: {}", status.message()),
    }
}

async fn ask(
    args: &QueryArgs,
    selector: v1::Selector,
    b: Option<v1::Selector>,
    period_hours: u32,
    items: &[String],
) -> anyhow::Result<(Value, String)> {
    let channel = connect(&args.aggregator, "aggregator", "--aggregator", &args.tls).await?;
    let mut client = QueryClient::with_interceptor(channel, auth(&args.tls)?)
        .accept_compressed(tonic::codec::CompressionEncoding::Zstd)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    let grpc = |s| explain(s, &args.aggregator);
    match args.question {
        Question::Overlap => {
            let reply = client
                .overlap(v1::OverlapRequest {
                    a: Some(selector),
                    b,
                })
                .await
                .map_err(grpc)?
                .into_inner();
            return Ok(sets::present_overlap(args, &reply));
        }
        Question::Retention => {
            let reply = client
                .retention(v1::RetentionRequest {
                    selector: Some(selector),
                    period_hours,
                })
                .await
                .map_err(grpc)?
                .into_inner();
            return Ok(sets::present_retention(args, period_hours, &reply));
        }
        Question::Membership if items.len() > 1 => {
            let reply = client
                .membership_batch(v1::MembershipBatchRequest {
                    selector: Some(selector),
                    items: items.iter().map(|i| i.clone().into_bytes()).collect(),
                })
                .await
                .map_err(grpc)?
                .into_inner();
            return Ok(present_batch(args, items, reply));
        }
        _ => {}
    }
    let item = items.first().cloned().unwrap_or_default().into_bytes();
    let reply = ask_one(&mut client, args, selector, &item).await?;
    let header = describe_selection(args, items.first().map(String::as_str));
    Ok(present(&header, reply, &item))
}

/// Asks one question of one selection: a count of distinct items, an item's frequency,
/// the top K, or one membership lookup.
async fn ask_one<F: tonic::service::Interceptor>(
    client: &mut QueryClient<
        tonic::service::interceptor::InterceptedService<tonic::transport::Channel, F>,
    >,
    args: &QueryArgs,
    selector: v1::Selector,
    item: &[u8],
) -> anyhow::Result<Reply> {
    let grpc = |s| explain(s, &args.aggregator);
    let selector = Some(selector);
    Ok(match args.question {
        Question::Distinct => Reply::Distinct(
            client
                .distinct(v1::DistinctRequest { selector })
                .await
                .map_err(grpc)?
                .into_inner(),
        ),
        Question::Frequency => Reply::Frequency(
            client
                .frequency(v1::FrequencyRequest {
                    selector,
                    item: item.to_vec(),
                })
                .await
                .map_err(grpc)?
                .into_inner(),
        ),
        Question::Topk => Reply::Topk(
            client
                .top_k(v1::TopKRequest {
                    selector,
                    k: args.k,
                })
                .await
                .map_err(grpc)?
                .into_inner(),
        ),
        Question::Membership => Reply::Membership(
            client
                .membership(v1::MembershipRequest {
                    selector,
                    item: item.to_vec(),
                })
                .await
                .map_err(grpc)?
                .into_inner(),
        ),
        Question::Overlap | Question::Retention => unreachable!("asked by `ask`"),
    })
}

/// A batch of membership answers: JSON `{"answers": [...]}`, each what one lookup prints,
/// and the text of each in turn.
fn present_batch(
    args: &QueryArgs,
    items: &[String],
    reply: v1::MembershipBatchResponse,
) -> (Value, String) {
    let mut values = Vec::with_capacity(items.len());
    let mut text = String::new();
    for (item, answer) in items.iter().zip(reply.answers) {
        let header = describe_selection(args, Some(item));
        let (mut value, one) = present(&header, Reply::Membership(answer), item.as_bytes());
        finish_json(&mut value, Question::Membership);
        values.push(value);
        if !text.is_empty() {
            text.push('\n');
        }
        text += &one;
    }
    (json!({ "answers": values }), text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_not_called_unreachable() {
        let refused = tonic::Status::unavailable(
            "cluster: this node cannot confirm it applied every acknowledged push",
        );
        let line = explain(refused, "http://agg-1:7701").to_string();
        assert!(
            line.starts_with("the aggregator at http://agg-1:7701 cannot answer now")
                && line.contains("cannot confirm")
                && !line.contains("cannot reach"),
            "{line}"
        );
        let mut dropped = tonic::Status::unavailable("connection reset");
        dropped.set_source(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        let line = explain(dropped, "http://agg-1:7701").to_string();
        assert!(
            line.starts_with("lost the connection to the aggregator at http://agg-1:7701"),
            "{line}"
        );
        let other = explain(tonic::Status::invalid_argument("bad --from"), "x").to_string();
        assert_eq!(other, "the aggregator answered: bad --from");
    }
}
