//! Traces over OTLP: a small in-process OTLP trace receiver; the aggregator and
//! `hourglass query` export to it when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and the
//! query's span in the aggregator is a child of the command's span, carried in the gRPC
//! call's `traceparent`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::util::{AggregatorProcess, TempDir};
use hourglass_rpc::proto::v1;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

/// A received span with the service that sent it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    span: Span,
}

#[derive(Default, Clone)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    spans.push(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| {
            Some(match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => s.clone(),
                Value::IntValue(i) => i.to_string(),
                Value::BoolValue(b) => b.to_string(),
                Value::DoubleValue(d) => d.to_string(),
                _ => return None,
            })
        })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_query_is_traced_from_the_command_through_the_aggregator() {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let dir = TempDir::new("otel");
    let agg = AggregatorProcess::start_with_env("127.0.0.1:0", &dir.file("agg"), &[], &env);

    // One snapshot to query.
    let channel = tonic::transport::Channel::from_shared(agg.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    v1::collector_client::CollectorClient::new(channel)
        .push(crate::util::one_item_push("web-1", "visitors", b"user1"))
        .await
        .unwrap();

    let query_env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let aggregator_url = agg.grpc.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args([
                "query",
                "distinct",
                "--metric",
                "visitors",
                "--aggregator",
                &aggregator_url,
                "--from",
                "-2h",
                "--json",
            ])
            .envs(query_env)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Wait for both ends of the query to arrive.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (cli, query, push) = loop {
        let spans = receiver.spans.lock().unwrap().clone();
        let find = |service: &str, name: &str| {
            spans
                .iter()
                .find(|r| r.service == service && r.span.name == name)
                .map(|r| r.span.clone())
        };
        if let (Some(cli), Some(query), Some(push)) = (
            find("hourglass", "hourglass query"),
            find("hourglass-aggregator", "query"),
            find("hourglass-aggregator", "push"),
        ) {
            break (cli, query, push);
        }
        assert!(
            Instant::now() < deadline,
            "spans received: {:?}",
            spans
                .iter()
                .map(|r| (&r.service, &r.span.name))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        query.trace_id, cli.trace_id,
        "the aggregator's span is in the command's trace"
    );
    assert_eq!(
        query.parent_span_id, cli.span_id,
        "and a child of the command's span"
    );
    assert_eq!(attribute(&cli, "question").as_deref(), Some("distinct"));
    assert_eq!(attribute(&query, "method").as_deref(), Some("distinct"));
    assert_eq!(attribute(&query, "metric").as_deref(), Some("visitors"));
    assert_eq!(attribute(&query, "sketches_merged").as_deref(), Some("1"));
    assert_eq!(attribute(&query, "hourly_rows").as_deref(), Some("1"));
    assert_eq!(attribute(&push, "server").as_deref(), Some("web-1"));
    assert_eq!(attribute(&push, "stored").as_deref(), Some("1"));
    assert!(
        agg.logs().contains("exporting traces over OTLP"),
        "{}",
        agg.logs()
    );
    server.abort();
}
