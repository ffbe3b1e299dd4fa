//! `hourglass-aggregator`: the program of [`hourglass_aggregator::cli`].

fn main() -> std::process::ExitCode {
    hourglass_aggregator::cli::main(std::env::args_os())
}
