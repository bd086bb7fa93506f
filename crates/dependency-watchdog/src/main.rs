//! `dependency-watchdog` binary: parses flags and runs the library.

use clap::Parser;

use dependency_watchdog::cli::{Cli, Command, normalize_go_flags};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse_from(normalize_go_flags(std::env::args_os()));
    match &cli.command {
        Command::Prober(args) | Command::Weeder(args) => dependency_watchdog::init_logging(args),
    }
    dependency_watchdog::run(cli)
        .await
        .map_err(anyhow::Error::from)
}
