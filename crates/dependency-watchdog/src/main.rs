//! `dependency-watchdog` binary: parses flags and runs the library.

use clap::Parser;

use dependency_watchdog::cli::{Cli, Command, normalize_go_flags};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse_from(normalize_go_flags(std::env::args_os()));
    match &cli.command {
        Command::Prober(args) | Command::Weeder(args) => dependency_watchdog::init_logging(args),
        Command::Explain(_) => {
            // explain prints its findings on stdout; keep the log to warnings on stderr.
            let _ = tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "warn".into()),
                )
                .with_writer(std::io::stderr)
                .try_init();
        }
    }
    match dependency_watchdog::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // The library's errors carry their whole context in Display; print it once.
            let error = anyhow::Error::from(error);
            tracing::error!("{error}");
            eprintln!("Error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
