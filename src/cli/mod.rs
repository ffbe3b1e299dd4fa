//! The `hourglass` command's subcommands.

mod cluster;
mod demo;
mod grpc;
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
pub(crate) struct Cli {
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
    /// Ask an aggregator: distinct counts, frequencies, top K, membership, the overlap of
    /// two selections or a retention table, over any time range and any servers, each with
    /// its error bar.
    ///
    /// Example: `hourglass query distinct --metric visitors --from -7d --label region=eu`;
    /// `hourglass query overlap --metric visitors --label region=eu --vs-server 'api-*'`;
    /// `hourglass query retention --metric visitors --from -28d --period week`
    Query(Box<query::QueryArgs>),
    /// Look at an aggregator cluster (cluster mode): its members, and which partitions
    /// have a ready node to answer for them.
    ///
    /// Example: `hourglass cluster status --aggregator agg-1:7700`
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
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
    /// Run the agent: the program `hourglass-agent`, built into this binary. Its flags
    /// follow (`hourglass agent --help`).
    #[command(disable_help_flag = true)]
    Agent(ServerArgs),
    /// Run the aggregator: the program `hourglass-aggregator`, built into this binary. Its
    /// flags follow (`hourglass aggregator --help`).
    #[command(disable_help_flag = true)]
    Aggregator(ServerArgs),
}

/// The command line of a server program run as a subcommand. `main` hands it over before
/// clap parses anything ([`server_command_line`]); this is what `--help` lists.
#[derive(Debug, clap::Args)]
struct ServerArgs {
    /// The program's flags.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<std::ffi::OsString>,
}

/// A server program built into this binary.
struct Server {
    /// Its subcommand: `hourglass SUBCOMMAND ARGS`.
    subcommand: &'static str,
    /// Its own name (a link's name in the image): `PROGRAM ARGS`.
    program: &'static str,
    /// Its entry point, given `[program, ARGS…]`.
    main: fn(Vec<std::ffi::OsString>) -> std::process::ExitCode,
}

/// The server programs built into this binary.
const SERVERS: [Server; 2] = [
    Server {
        subcommand: "agent",
        program: "hourglass-agent",
        main: hourglass_agent::cli::main,
    },
    Server {
        subcommand: "aggregator",
        program: "hourglass-aggregator",
        main: hourglass_aggregator::cli::main,
    },
];

/// Runs the command line `args` (`args[0]` the name it was called by) as this command's
/// own subcommands; returns the exit status. An error is one line on stderr: the error
/// and its causes, no backtrace.
pub fn main(args: Vec<std::ffi::OsString>) -> std::process::ExitCode {
    let done = match Cli::parse_from(args).command {
        // `main.rs` runs the servers before clap parses (`server_command_line`); these
        // arms serve only if clap ever matches them otherwise.
        Command::Agent(server) => return run_server_subcommand("agent", server),
        Command::Aggregator(server) => return run_server_subcommand("aggregator", server),
        Command::Demo(args) => demo::run(args),
        Command::Sketch(cmd) => sketch::run(cmd),
        Command::Query(args) => query::run(*args),
        Command::Cluster(command) => cluster::run(command),
        Command::Send(args) => send::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Health(args) => health::run(args),
    };
    match done {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hourglass: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A server's program name and its command line, `[program, ARGS…]`, every argument as
/// given: for `hourglass-agent ARGS` (called by a server's name, as a link in the image)
/// and for `hourglass agent ARGS` (its subcommand). `None` for everything else.
pub fn server_command_line(
    args: &[std::ffi::OsString],
) -> Option<(&'static str, Vec<std::ffi::OsString>)> {
    let called_as = args
        .first()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .and_then(|name| name.to_str());
    if let Some(server) = SERVERS.iter().find(|s| Some(s.program) == called_as) {
        return Some((server.program, args.to_vec()));
    }
    let subcommand = args.get(1)?.to_str()?;
    let program = SERVERS.iter().find(|s| s.subcommand == subcommand)?.program;
    let line = std::iter::once(program.into())
        .chain(args[2..].iter().cloned())
        .collect();
    Some((program, line))
}

/// Runs the server program named `program` ([`SERVERS`]) with its command line.
pub fn run_server(program: &str, line: Vec<std::ffi::OsString>) -> std::process::ExitCode {
    let server = SERVERS
        .iter()
        .find(|s| s.program == program)
        .expect("a server program of SERVERS");
    (server.main)(line)
}

/// Runs the server of `subcommand` with the arguments clap gathered for it.
fn run_server_subcommand(subcommand: &str, server: ServerArgs) -> std::process::ExitCode {
    let mut args = vec!["hourglass".into(), subcommand.into()];
    args.extend(server.args);
    let (program, line) = server_command_line(&args).expect("a server subcommand");
    run_server(program, line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_server_subcommand_gets_every_argument_untouched() {
        use std::os::unix::ffi::OsStringExt;
        let cases: Vec<Vec<OsString>> = vec![
            os(&["--help"]),
            os(&["-h"]),
            os(&["--version"]),
            os(&["-V"]),
            os(&["help"]),
            os(&["--data-dir", "-d"]),
            os(&["--server-name=a", "--", "--label"]),
            os(&["--server-name", "--"]),
            os(&["--", "--data-dir", "x"]),
            os(&["--"]),
            os(&[]),
            vec!["--data-dir".into(), OsString::from_vec(vec![b'd', 0xff])],
        ];
        for (sub, program) in [
            ("agent", "hourglass-agent"),
            ("aggregator", "hourglass-aggregator"),
        ] {
            for args in &cases {
                let mut all = os(&["/usr/local/bin/hourglass", sub]);
                all.extend(args.iter().cloned());
                let (name, line) = server_command_line(&all).expect("a server subcommand");
                assert_eq!(name, program);
                assert_eq!(line[0], program);
                assert_eq!(&line[1..], &args[..], "{sub} {args:?}");
            }
        }
        assert!(server_command_line(&os(&["hourglass", "query", "agent"])).is_none());
        assert!(server_command_line(&os(&["hourglass"])).is_none());
    }

    #[test]
    fn the_server_subcommands_are_listed_in_help() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let help = Cli::command().render_help().to_string();
        assert!(
            help.contains("agent") && help.contains("aggregator"),
            "{help}"
        );
    }
}
