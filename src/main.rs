//! `hourglass`: the user's command line, and a multi-call binary for the servers.
//!
//! Called as `hourglass-agent` or `hourglass-aggregator` (a link of that name, as in the
//! container image), or as `hourglass agent …` / `hourglass aggregator …`, it runs that
//! program; otherwise it parses its own subcommands (`cli`).

mod cli;

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match cli::server_command_line(&args) {
        Some((program, line)) => cli::run_server(program, line),
        None => cli::main(args),
    }
}
