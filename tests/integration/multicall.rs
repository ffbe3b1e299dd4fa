//! The multi-call `hourglass` binary: the servers run as `hourglass agent|aggregator
//! ARGS` and through links named like them (as in the image) behave alike.

use crate::util::{InProcessAggregator, ServiceProcess, TempDir, server_binary, this_hour};
use std::process::Command;

/// The two ways to run server `name` (`agent`, `aggregator`): the link and the subcommand.
fn both_forms(name: &str) -> [(String, Command); 2] {
    let link = Command::new(server_binary(&format!("hourglass-{name}")));
    let mut sub = Command::new(env!("CARGO_BIN_EXE_hourglass"));
    sub.arg(name);
    [
        (format!("hourglass-{name}"), link),
        (format!("hourglass {name}"), sub),
    ]
}

#[test]
fn a_failing_start_exits_1_with_one_error_line_in_both_forms() {
    let dir = TempDir::new("multicall-fail");
    let missing = dir.file("no-such.toml");
    for name in ["agent", "aggregator"] {
        for (form, mut command) in both_forms(name) {
            let out = command
                .args(["--config", &missing, "--data-dir", &dir.file(name)])
                .args(["--admin-listen", "127.0.0.1:0"])
                .output()
                .expect("run");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{form}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{form}: {stderr}");
            assert!(stderr.starts_with("error: "), "{form}: {stderr}");
            assert!(stderr.contains("no-such.toml"), "{form}: {stderr}");
        }
    }
}

#[test]
fn version_and_help_are_the_servers_in_both_forms() {
    let version = env!("CARGO_PKG_VERSION");
    for name in ["agent", "aggregator"] {
        for flag in ["--version", "-V"] {
            for (form, mut command) in both_forms(name) {
                let out = command.arg(flag).output().expect("run");
                assert_eq!(out.status.code(), Some(0), "{form} {flag}");
                assert_eq!(
                    String::from_utf8_lossy(&out.stdout),
                    format!("hourglass-{name} {version}\n"),
                    "{form} {flag}"
                );
            }
        }
        for flag in ["--help", "-h"] {
            for (form, mut command) in both_forms(name) {
                let out = command.arg(flag).output().expect("run");
                let text = String::from_utf8_lossy(&out.stdout);
                assert_eq!(out.status.code(), Some(0), "{form} {flag}");
                assert!(
                    text.contains(&format!("Usage: hourglass-{name} [OPTIONS]")),
                    "{form} {flag}: {text}"
                );
            }
        }
        // A bad flag is the server's usage error (exit 2), naming the server.
        for (form, mut command) in both_forms(name) {
            let out = command.arg("--no-such-flag").output().expect("run");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{form}: {stderr}");
            assert!(
                stderr.contains(&format!("Usage: hourglass-{name} [OPTIONS]")),
                "{form}: {stderr}"
            );
        }
    }
}

#[test]
fn hourglass_env_reaches_the_subcommand() {
    let dir = TempDir::new("multicall-env");
    for name in ["agent", "aggregator"] {
        for (form, mut command) in both_forms(name) {
            let out = command
                .env("HOURGLASS_CONFIG", dir.file("env-config.toml"))
                .env("HOURGLASS_DATA_DIR", dir.file(name))
                .args(["--admin-listen", "127.0.0.1:0"])
                .output()
                .expect("run");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{form}: {stderr}");
            assert!(stderr.contains("env-config.toml"), "{form}: {stderr}");
        }
    }
}

/// `hourglass agent …` (as `hourglass simulate --spawn` and the demo start it): SIGTERM
/// reaches the agent itself and its final flush ships.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_to_hourglass_agent_subcommand_makes_a_final_flush() {
    let dir = TempDir::new("multicall-term");
    let agg = InProcessAggregator::start(&dir.file("agg"));
    let data = dir.file("agent");
    let agent = ServiceProcess::start(
        "agent",
        env!("CARGO_BIN_EXE_hourglass").into(),
        &[
            "agent",
            "--server-name",
            "web-1",
            "--aggregator",
            &agg.grpc,
            "--statsd-listen",
            "127.0.0.1:0",
            "--ingest-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--data-dir",
            &data,
            "--flush-interval",
            "1h",
        ],
        &["statsd", "ingest", "admin"],
    );
    let ingest = agent.addr("ingest");
    let users: Vec<String> = (0..50).map(|i| format!("user{i}")).collect();
    let mut args = vec!["send", "--agent", &ingest, "visitors"];
    args.extend(users.iter().map(String::as_str));
    let run = crate::util::hourglass(&args, b"").ok();
    assert!(run.text().contains("50 accepted"), "{}", run.text());
    assert_eq!(agent.terminate().code(), Some(0));
    let h = this_hour();
    let mut q = hourglass_rpc::proto::v1::query_client::QueryClient::new(
        tonic::transport::Channel::from_shared(agg.grpc.clone())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let answer = q
        .distinct(hourglass_rpc::proto::v1::DistinctRequest {
            selector: crate::aggregator::selector("visitors", h - 1..h + 1),
        })
        .await
        .expect("distinct")
        .into_inner();
    assert_eq!(
        answer.answer.expect("answer").estimate.round(),
        50.0,
        "the final flush shipped"
    );
    drop(q);
    agg.stop().await;
}
