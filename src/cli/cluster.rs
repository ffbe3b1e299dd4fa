//! `hourglass cluster status`: one node's view of an aggregator cluster (cluster mode,
//! DESIGN §10): the live members, what each applies and answers for, and the partitions
//! that have fewer ready nodes than owners, or none.

use anyhow::Context;
use clap::{Args, Subcommand};
use hourglass_rpc::proto::v1::{self, peer_client::PeerClient};
use serde_json::json;

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// The cluster as one node sees it: members, partitions and their ready owners.
    ///
    /// Example: `hourglass cluster status --aggregator agg-1:7700`
    Status(StatusArgs),
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    tls: super::grpc::TlsArgs,
    /// The gRPC address of any node of the cluster: `host:port` or a URL.
    #[arg(long, env = "HOURGLASS_AGGREGATOR", default_value = super::grpc::DEFAULT_AGGREGATOR)]
    aggregator: String,
    /// Print JSON (the StatusResponse's fields) instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    let ClusterCommand::Status(args) = command;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let status = runtime.block_on(async {
        let channel =
            super::grpc::connect(&args.aggregator, "aggregator", "--aggregator", &args.tls).await?;
        let mut client = PeerClient::with_interceptor(channel, super::grpc::auth(&args.tls)?);
        let reply = client
            .status(v1::StatusRequest {})
            .await
            .map_err(|s| match s.code() {
                tonic::Code::Unimplemented => anyhow::anyhow!(
                    "{} is not in cluster mode (no [cluster] section in its config)",
                    args.aggregator
                ),
                _ => anyhow::anyhow!("{}: {}", args.aggregator, s.message()),
            })?;
        anyhow::Ok(reply.into_inner())
    })?;
    let text = if args.json {
        serde_json::to_string_pretty(&to_json(&status))? + "\n"
    } else {
        render(&status)
    };
    print!("{text}");
    Ok(())
}

fn to_json(s: &v1::StatusResponse) -> serde_json::Value {
    json!({
        "node": s.node,
        "owners": s.owners,
        "subjects": s.subjects,
        "stream_last_sequence": s.stream_last_sequence,
        "applied_sequence": s.applied_sequence,
        "stream": s.stream.as_ref().map(|st| json!({
            "name": st.name,
            "leader": st.leader,
            "messages": st.messages,
            "bytes": st.bytes,
            "replicas": st.replicas.iter().map(|r| json!({
                "name": r.name,
                "current": r.current,
                "offline": r.offline,
                "lag": r.lag,
                "seen_ms_ago": r.seen_ms_ago,
            })).collect::<Vec<_>>(),
        })),
        "members": s.members.iter().map(|m| json!({
            "node": m.node,
            "advertise": m.advertise,
            "ready": m.ready,
            "applying": m.applying,
            "started_unix": m.started_unix,
            "version": m.version,
        })).collect::<Vec<_>>(),
        "partitions": s.partitions.iter().map(|p| json!({
            "partition": p.partition,
            "owners": p.owners,
            "ready": p.ready,
        })).collect::<Vec<_>>(),
    })
}

/// The text form: members, then the partitions that need attention.
fn render(s: &v1::StatusResponse) -> String {
    let subjects = match s.subjects {
        0 => String::new(),
        n => format!(" in {n} subjects"),
    };
    let mut text = format!(
        "node {} sees {} members; {} partitions{subjects}, {} owners each\n",
        s.node,
        s.members.len(),
        s.partitions.len(),
        s.owners
    );
    if s.members.is_empty() {
        text += "warning: this node is not a member now (it cannot renew its membership in NATS): it answers for no partition\n";
    }
    let width = s
        .members
        .iter()
        .map(|m| m.node.len())
        .max()
        .unwrap_or(4)
        .max(4);
    text += &format!(
        "  {:<width$}  {:<24}  {:>5}  {:>8}  version\n",
        "node", "advertise", "ready", "applying"
    );
    for m in &s.members {
        text += &format!(
            "  {:<width$}  {:<24}  {:>5}  {:>8}  {}\n",
            m.node,
            m.advertise,
            m.ready.len(),
            m.applying.len(),
            m.version
        );
    }
    let none: Vec<u32> = s
        .partitions
        .iter()
        .filter(|p| p.ready.is_empty())
        .map(|p| p.partition)
        .collect();
    let short: Vec<u32> = s
        .partitions
        .iter()
        .filter(|p| !p.ready.is_empty() && p.ready.len() < p.owners.len())
        .map(|p| p.partition)
        .collect();
    text += &match none.len() {
        0 => "every partition has a ready node\n".to_string(),
        n => format!(
            "warning: {n} partitions have no ready node (queries report them missing): {}\n",
            list(&none)
        ),
    };
    if !short.is_empty() {
        text += &format!(
            "{} partitions have fewer ready nodes than owners (catching up): {}\n",
            short.len(),
            list(&short)
        );
    }
    text += &format!(
        "stream: last sequence {}; this node applied up to {}\n",
        s.stream_last_sequence, s.applied_sequence
    );
    text += &stream_line(s.stream.as_ref());
    text
}

/// Where the stream lives: its leader and each replica's state, or that JetStream did not
/// say.
fn stream_line(stream: Option<&v1::StreamStatus>) -> String {
    let Some(stream) = stream else {
        return "stream: JetStream did not report its leader and replicas\n".to_string();
    };
    let leader = match stream.leader.as_str() {
        "" => "warning: no leader (an election; publishes wait)".to_string(),
        leader => format!("leader {leader}"),
    };
    let replicas: Vec<String> = stream
        .replicas
        .iter()
        .map(|r| {
            let state = if r.offline {
                format!("offline, last heard {} ms ago", r.seen_ms_ago)
            } else if r.current {
                "current".to_string()
            } else {
                format!("{} operations behind", r.lag)
            };
            format!("{} ({state})", r.name)
        })
        .collect();
    let replicas = match replicas.len() {
        0 => "no other replica".to_string(),
        _ => format!("replicas {}", replicas.join(", ")),
    };
    format!(
        "stream {}: {leader}; {replicas}; {} messages, {} bytes\n",
        stream.name, stream.messages, stream.bytes
    )
}

/// Up to 20 partition numbers, and how many more.
fn list(partitions: &[u32]) -> String {
    let shown: Vec<String> = partitions.iter().take(20).map(u32::to_string).collect();
    match partitions.len() {
        n if n > 20 => format!("{} and {} more", shown.join(", "), n - 20),
        _ => shown.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_names_partitions_without_a_ready_node() {
        let status = v1::StatusResponse {
            node: "agg-1".into(),
            members: vec![v1::Member {
                node: "agg-1".into(),
                advertise: "127.0.0.1:7311".into(),
                ready: vec![0],
                applying: vec![0, 1],
                started_unix: 0,
                version: "0.1.0".into(),
            }],
            partitions: vec![
                v1::PartitionStatus {
                    partition: 0,
                    owners: vec!["agg-1".into(), "agg-2".into()],
                    ready: vec!["agg-1".into()],
                },
                v1::PartitionStatus {
                    partition: 1,
                    owners: vec!["agg-1".into()],
                    ready: vec![],
                },
            ],
            owners: 2,
            stream_last_sequence: 9,
            applied_sequence: 7,
            stream: None,
            subjects: 3,
        };
        let text = render(&status);
        assert!(
            text.starts_with(
                "node agg-1 sees 1 members; 2 partitions in 3 subjects, 2 owners each\n"
            ),
            "{text}"
        );
        assert_eq!(to_json(&status)["subjects"], json!(3));
        assert!(
            text.contains("1 partitions have no ready node (queries report them missing): 1\n"),
            "{text}"
        );
        assert!(
            text.contains("1 partitions have fewer ready nodes than owners (catching up): 0\n"),
            "{text}"
        );
        assert!(text.contains("applied up to 7"), "{text}");
        assert_eq!(to_json(&status)["partitions"][1]["ready"], json!([]));
        assert!(
            text.contains("stream: JetStream did not report its leader and replicas\n"),
            "{text}"
        );
    }

    #[test]
    fn the_text_names_the_streams_leader_and_each_replicas_state() {
        let replica = |name: &str, current, offline, lag| v1::StreamReplica {
            name: name.into(),
            current,
            offline,
            lag,
            seen_ms_ago: 4200,
        };
        let mut stream = v1::StreamStatus {
            name: "HOURGLASS".into(),
            leader: "nats-2".into(),
            replicas: vec![
                replica("nats-1", true, false, 0),
                replica("nats-3", false, false, 12),
            ],
            messages: 340,
            bytes: 98_000,
        };
        assert_eq!(
            stream_line(Some(&stream)),
            "stream HOURGLASS: leader nats-2; replicas nats-1 (current), nats-3 (12 operations behind); 340 messages, 98000 bytes\n"
        );
        stream.leader.clear();
        stream.replicas = vec![replica("nats-3", false, true, 0)];
        let line = stream_line(Some(&stream));
        assert!(line.contains("warning: no leader"), "{line}");
        assert!(
            line.contains("nats-3 (offline, last heard 4200 ms ago)"),
            "{line}"
        );
    }
}
