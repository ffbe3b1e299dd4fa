//! `hourglass-agent`: the program of [`hourglass_agent::cli`].

fn main() -> std::process::ExitCode {
    hourglass_agent::cli::main(std::env::args_os())
}
