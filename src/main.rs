//! `hourglass`: the user's command line, and a multi-call binary for the servers.
//!
//! Called as `hourglass-agent` or `hourglass-aggregator` (a link of that name, as in the
//! container image), or as `hourglass agent …` / `hourglass aggregator …`, it runs that
//! program; otherwise it parses its own subcommands (`cli`).

mod cli;

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let called_as = args
        .first()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .and_then(|name| name.to_str());
    match called_as {
        Some("hourglass-agent") => hourglass_agent::cli::main(args),
        Some("hourglass-aggregator") => hourglass_aggregator::cli::main(args),
        _ => cli::main(args),
    }
}
