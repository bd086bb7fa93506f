//! `dwd-testenv`: brings up a seed and N shoot apiservers from the test environment, prints
//! what runs (addresses, pids, kubeconfig paths), and keeps them until Ctrl-C.
//!
//! `--shoots N` (default 2), `--once` to stop right after printing (used to time startup).

#![forbid(unsafe_code)]

use std::time::Instant;

use dwd_testenv::{ApiServerOptions, TestEnv};

fn parse_args() -> Result<(usize, bool), String> {
    let mut shoots = 2usize;
    let mut once = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--shoots" => {
                let v = args.next().ok_or("--shoots needs a number")?;
                shoots = v.parse().map_err(|e| format!("--shoots {v}: {e}"))?;
            }
            "--once" => once = true,
            "-h" | "--help" => {
                println!("usage: dwd-testenv [--shoots N] [--once]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok((shoots, once))
}

#[tokio::main]
async fn main() {
    let (shoots, once) = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("dwd-testenv: {e}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let env = match TestEnv::start().await {
        Ok(env) => env,
        Err(e) => {
            eprintln!("dwd-testenv: {e}");
            std::process::exit(1);
        }
    };
    let etcd_ready = started.elapsed();
    let names: Vec<String> = (1..=shoots).map(|i| format!("shoot-{i}")).collect();
    let mut starts = vec![env.start_apiserver_with("seed", ApiServerOptions::seed())];
    for name in &names {
        starts.push(env.start_apiserver_with(name, ApiServerOptions::default()));
    }
    for result in futures::future::join_all(starts).await {
        if let Err(e) = result {
            eprintln!("dwd-testenv: {e}");
            std::process::exit(1);
        }
    }
    print!("{}", env.describe());
    println!(
        "ready in {:.2}s (etcd {:.2}s)",
        started.elapsed().as_secs_f64(),
        etcd_ready.as_secs_f64()
    );
    if once {
        return;
    }
    println!("press Ctrl-C to stop everything");
    let _ = tokio::signal::ctrl_c().await;
}
