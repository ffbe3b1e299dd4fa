//! The `hourglass` command's subcommands.

mod numbers;
mod query;
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
    /// Build, merge and inspect sketches as files: count distinct lines of a huge log in
    /// kilobytes, merge sketches another machine made, debug exported sketches.
    #[command(subcommand)]
    Sketch(sketch::SketchCommand),
    /// Ask an aggregator: distinct counts, frequencies, top K or membership over any time
    /// range and any servers, each with its error bar.
    ///
    /// Example: `hourglass query distinct --metric visitors --from -7d --label region=eu`
    Query(query::QueryArgs),
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Sketch(cmd) => sketch::run(cmd),
        Command::Query(args) => query::run(args),
    }
}
