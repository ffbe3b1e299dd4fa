//! `hourglass demo` and `hourglass simulate`: the main job, as a user runs it.

use crate::util::{InProcessAggregator, TempDir, hourglass};

#[test]
fn the_demo_reports_every_answer_beside_the_truth_and_a_second_run_reuses_the_data() {
    // The demo runs the aggregator and the agents as `hourglass aggregator` / `hourglass agent`.
    let dir = TempDir::new("demo");
    let data = dir.file("demo");
    let args = [
        "demo",
        "--exit",
        "--data-dir",
        &data,
        "--agents",
        "3",
        "--days",
        "2",
        "--events-per-hour",
        "150",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ];
    let run = hourglass(&args, b"").ok();
    let report = run.text();
    // Two days, the whole range and three regions, each with the truth in its interval
    // (a fixed seed: the same traffic every run).
    let rows: Vec<&str> = report
        .lines()
        .filter(|l| l.trim_end().ends_with(" yes") || l.trim_end().ends_with(" NO"))
        .collect();
    assert!(rows.len() >= 2 + 1 + 3 + 10, "{report}");
    assert!(!report.contains(" NO"), "{report}");
    assert!(report.contains("0 server-hours without data"), "{report}");
    for probe in ["nobody0        no ", "user0          maybe"] {
        assert!(report.contains(probe), "{probe}: {report}");
    }
    // Membership over the whole range: each server-hour's filter looked up (3 servers × 48
    // hours), thousands of absent users mostly definitely absent, every sampled present
    // user found wherever it was seen (both rows end in "yes", counted above).
    for line in [
        "definitely absent from all 144 filters",
        "absent users answered definitely absent",
        "false-positive probability of a lookup",
        "present users found wherever they were seen",
    ] {
        assert!(report.contains(line), "{line}: {report}");
    }
    let row = |start: &str| {
        report
            .lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_default()
            .to_string()
    };
    assert!(row("absent users").ends_with(" yes"), "{report}");
    assert!(row("present users").ends_with(" yes"), "{report}");
    // The commands it prints run as printed: each names this very binary as a shell
    // finds it (its path when `hourglass` on PATH is another program or none), and each
    // parses (`--help` after it, as the aggregator has stopped).
    let commands: Vec<&str> = report
        .lines()
        .skip_while(|l| *l != "Try next:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(str::trim)
        .collect();
    assert_eq!(commands.len(), 5, "{report}");
    let me = std::fs::canonicalize(env!("CARGO_BIN_EXE_hourglass")).unwrap();
    for command in commands {
        let words: Vec<&str> = command.split_whitespace().collect();
        assert_eq!(words[1], "query", "{command}");
        let program = std::path::Path::new(words[0]);
        let found = if program.components().count() > 1 {
            std::fs::canonicalize(program).ok()
        } else {
            std::env::var_os("PATH").and_then(|path| {
                std::env::split_paths(&path)
                    .find_map(|dir| std::fs::canonicalize(dir.join(program)).ok())
            })
        };
        assert_eq!(found.as_ref(), Some(&me), "{command}: {report}");
        let parsed = std::process::Command::new(words[0])
            .args(&words[1..])
            .arg("--help")
            .output()
            .unwrap();
        assert!(parsed.status.success(), "{command} --help: {parsed:?}");
    }
    assert!(run.stderr.contains("final flush"), "{}", run.stderr);

    // Again on the same data dir: the stored week is reported, not sent twice.
    let again = hourglass(&args, b"").ok();
    assert!(
        again.stderr.contains("already holds the simulated traffic"),
        "{}",
        again.stderr
    );
    let whole = |text: &str| {
        text.lines()
            .find(|l| l.contains("whole range"))
            .map(str::to_string)
    };
    assert_eq!(
        whole(&again.text()),
        whole(&report),
        "the same answer from the same data"
    );
}

#[test]
fn simulate_writes_the_truth_and_spawned_agents_deliver_it() {
    let dir = TempDir::new("simulate");
    let agg = InProcessAggregator::start(&dir.file("agg"));
    let truth_file = dir.file("truth.json");
    let run = hourglass(
        &[
            "simulate",
            "--spawn",
            "2",
            "--aggregator",
            &agg.grpc,
            "--days",
            "1",
            "--events-per-hour",
            "40",
            "--seed",
            "5",
            "--truth",
            &truth_file,
            "--spawn-dir",
            &dir.file("fleet"),
        ],
        b"",
    )
    .ok();
    assert!(
        run.text()
            .contains("sent 1,920 visits (3,840 events) over 24 hours"),
        "{}",
        run.text()
    );
    let truth: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&truth_file).unwrap()).unwrap();
    let exact = truth["total"]["distinct"].as_u64().unwrap();
    assert_eq!(truth["events"], 1920);
    let from =
        hourglass_rpc::time::hour_start(truth["start_hour"].as_u64().unwrap() as u32).to_rfc3339();
    let to =
        hourglass_rpc::time::hour_start(truth["end_hour"].as_u64().unwrap() as u32).to_rfc3339();
    let answer = hourglass(
        &[
            "query",
            "distinct",
            "--metric",
            "visitors",
            "--aggregator",
            &agg.grpc,
            "--from",
            &from,
            "--to",
            &to,
            "--json",
        ],
        b"",
    )
    .ok()
    .json();
    let (lo, hi) = (
        answer["lower95"].as_f64().unwrap(),
        answer["upper95"].as_f64().unwrap(),
    );
    // Four standard errors either side: a miss is a real loss, not noise.
    let se = answer["std_error"].as_f64().unwrap();
    assert!(
        (lo - 2.0 * se..=hi + 2.0 * se).contains(&(exact as f64)),
        "{answer} vs {exact}"
    );
    assert_eq!(answer["server_hours_missing"], 0, "{answer}");
    // The same seed gives the same truth.
    let again = dir.file("again.json");
    let agg2 = InProcessAggregator::start(&dir.file("agg2"));
    hourglass(
        &[
            "simulate",
            "--spawn",
            "2",
            "--aggregator",
            &agg2.grpc,
            "--days",
            "1",
            "--events-per-hour",
            "40",
            "--seed",
            "5",
            "--truth",
            &again,
            "--spawn-dir",
            &dir.file("fleet2"),
        ],
        b"",
    )
    .ok();
    assert_eq!(
        std::fs::read(&again).unwrap(),
        std::fs::read(&truth_file).unwrap()
    );
}
