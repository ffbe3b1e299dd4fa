//! `hourglass`: the user's command line. Parses arguments and hands off to `cli`.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // One clear line: the error and its causes, no backtrace.
            eprintln!("hourglass: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
