//! `dependency-watchdog` binary: parses flags and runs the library.

use clap::Parser;

use dependency_watchdog::process::cli::{Cli, Command, normalize_go_flags};

fn main() -> std::process::ExitCode {
    limit_malloc_arenas();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("Error: starting the tokio runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async_main())
}

/// One glibc malloc arena for the whole process (glibc's default is up to 8 per core, each
/// growing and fragmenting on its own). Probe runs allocate small, short-lived objects on
/// whichever worker thread they land on; one arena keeps the freed memory reusable by all of
/// them. Measured with `bench` at 100 shoots: steady RSS 24.8 → 20.4 MiB, CPU unchanged
/// (crates/dwd-bench/README.md). Must run before any thread starts.
// `mallopt` has no safe wrapper; the crate's library forbids `unsafe` outright.
#[allow(unsafe_code)]
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable; it is called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

async fn async_main() -> std::process::ExitCode {
    let cli = Cli::parse_from(normalize_go_flags(std::env::args_os()));
    match &cli.command {
        Command::Prober(args) | Command::Weeder(args) => {
            dependency_watchdog::observe::logging::init(
                dependency_watchdog::observe::logging::LogSettings::from_args(args),
            )
        }
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
    // After the log is set up, so the debug line about it shows.
    dependency_watchdog::process::runtime::raise_open_files_limit();
    let explain = matches!(cli.command, Command::Explain(_));
    match dependency_watchdog::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // The library's errors carry their whole context in Display; print it once. A
            // log pipeline reading the prober's or weeder's stderr gets it as a log line, and
            // only as one (the reference logs it and exits); without such a line (a level
            // above error) and for explain, a person reads it as plain text.
            let error = anyhow::Error::from(error);
            if !explain && tracing::enabled!(tracing::Level::ERROR) {
                // One log line per line of the error (a config error lists one problem a
                // line): every log value is cut to 300 bytes (`logging`), and a problem
                // further down must not be cut off.
                for line in error.to_string().lines() {
                    tracing::error!("{line}");
                }
            } else {
                eprintln!("Error: {error}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
