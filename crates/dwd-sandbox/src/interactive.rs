//! Interactive mode: the sandbox keeps running and takes commands on stdin to break and heal
//! things, while the timeline keeps printing and the user explores with kubectl.

use std::io::BufRead;

use anyhow::{Result, bail};
use tokio::sync::mpsc;

use crate::journal::MarkerKind;
use crate::monitor::ShootView;
use crate::sandbox::Sandbox;

const HELP: &str = "\
commands:
  silence <shoot> <percent>   stop renewing the node leases of that share of the shoot's kubelets
  heal <shoot>                every kubelet of the shoot renews its lease again
  stop <shoot>                stop the shoot's kube-apiserver (connections refused)
  start <shoot>               start it again
  crashloop <shoot>           put the shoot's kube-apiserver pods into CrashLoopBackOff (its
                              kube-apiserver service loses its endpoints, its kube-scheduler
                              crash-loops too)
  etcd-down <shoot>           etcd-main-client loses its ready endpoints
  etcd-up <shoot>             etcd-main-client is ready again (the weeder restarts the
                              kube-apiserver pods, then the kube-scheduler)
  zone-out <shoot> <zone>     the zone loses its NAT gateway: every kubelet in it stops
                              renewing its lease (zonal protection scales down MCM and CA)
  zone-heal <shoot> <zone>    the zone's kubelets renew again
  status                      replicas, expired-lease fraction (per zone too), probes, pods
  help                        this text
  quit                        tear everything down and exit (also: end of input, Ctrl-C)";

/// The help text, with the shoots (and their zones) of this sandbox.
fn help(sb: &Sandbox) -> String {
    let shoots: Vec<String> = sb
        .shoots
        .iter()
        .map(|s| {
            if s.zones.is_empty() {
                format!("{} ({} nodes)", s.name, s.nodes)
            } else {
                format!(
                    "{} ({} nodes in zones {})",
                    s.name,
                    s.nodes,
                    s.zones.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            }
        })
        .collect();
    format!("{HELP}\nshoots: {}", shoots.join(", "))
}

/// Prints where everything is and how to look at it.
fn print_hints(sb: &Sandbox, dir: &std::path::Path) {
    let j = &sb.journal;
    let alpha_ns = sb.shoots.first().map_or("", |s| s.namespace.as_str());
    j.say("\nThe sandbox is running. Explore it with kubectl:");
    j.say(&format!(
        "  export KUBECONFIG={}          # the seed",
        sb.seed_kubeconfig.display()
    ));
    for s in &sb.shoots {
        j.say(&format!(
            "  {:<5} kubeconfig {}   namespace in the seed: {}",
            s.name,
            s.kubeconfig.display(),
            s.namespace
        ));
    }
    j.say(&format!(
        "  kubectl get deploy,pods,endpointslices -n {alpha_ns}\n  kubectl get events -A --sort-by=.lastTimestamp\n  kubectl get cluster {alpha_ns} -o yaml\n  kubectl --kubeconfig {} get nodes\n  kubectl --kubeconfig {} get leases -n kube-node-lease\n  curl -s http://{}/metrics | grep dwd_prober\n  curl -s http://{}/metrics | grep dwd_weeder",
        sb.shoots.first().map_or(String::new(), |s| s.kubeconfig.display().to_string()),
        sb.shoots.first().map_or(String::new(), |s| s.kubeconfig.display().to_string()),
        sb.prober.metrics,
        sb.weeder.metrics,
    ));
    j.say(&format!(
        "  configs: {}, {}\n  logs:    {}, {}\n  files:   {}",
        sb.prober_config.display(),
        sb.weeder_config.display(),
        sb.prober.log.display(),
        sb.weeder.log.display(),
        dir.display()
    ));
    j.say(&format!("\n{}\n", help(sb)));
}

/// One shoot's lines of the `status` text: the prober's finding, the controllers' replicas,
/// the zones, and the weeder's services and pods.
fn shoot_status(sb: &Sandbox, s: &ShootView) -> String {
    let mut out = String::new();
    let fraction = s.fraction.map_or("no probe result yet".into(), |f| {
        format!("the prober found {}", s.leases_text(f))
    });
    out.push_str(&format!(
        "  {} ({}): {fraction}; {} probe runs, {} API-server probe failures; {} of {} kubelets silenced; kube-apiserver {}\n",
        s.name,
        s.namespace,
        s.probe_runs.unwrap_or(0),
        s.api_failures,
        s.silenced,
        s.nodes,
        if s.apiserver_up { "up" } else { "stopped" },
    ));
    let controllers: Vec<String> = sb
        .config
        .controllers
        .iter()
        .map(|c| {
            let spec = s.replicas.get(&c.name).copied().unwrap_or(-1);
            let ready = s.ready.get(&c.name).copied().unwrap_or(-1);
            let protected = s
                .annotations
                .get(&c.name)
                .and_then(|a| a.get(crate::monitor::REPLICAS_ANNOTATION))
                .map_or(String::new(), |r| format!(", recorded {r}"));
            format!("{} {spec} (ready {ready}{protected})", c.short)
        })
        .collect();
    out.push_str(&format!("      controllers: {}\n", controllers.join(", ")));
    if let Some(zones) = s.zones_text() {
        out.push_str(&format!(
            "      zones (expired fraction the prober found, zoneLeaseFailureFraction {:.2}): {zones}\n",
            s.zone_threshold
        ));
    }
    let pods: Vec<String> = s
        .pods
        .iter()
        .filter(|(_, p)| !p.deleted)
        .map(|(n, p)| {
            format!(
                "{n} {}",
                if p.crashlooping {
                    "CrashLoopBackOff"
                } else {
                    "Running"
                }
            )
        })
        .collect();
    out.push_str(&format!(
        "      etcd-main-client {}, kube-apiserver {}; pods: {}\n",
        if s.etcd_ready { "ready" } else { "not ready" },
        if s.kube_apiserver_ready {
            "ready"
        } else {
            "not ready"
        },
        pods.join(", ")
    ));
    out
}

/// The `status` text.
fn status(sb: &Sandbox) -> String {
    let v = sb.view();
    let mut out = String::new();
    for s in &v.shoots {
        out.push_str(&shoot_status(sb, s));
    }
    out.push_str(&format!(
        "  prober {} (threshold {:.2}), weeder {}: {} active weeder(s), {} pod(s) deleted",
        if v.prober_reachable {
            "running"
        } else {
            "metrics unreachable"
        },
        sb.config.threshold(),
        if v.weeder_reachable {
            "running"
        } else {
            "metrics unreachable"
        },
        v.active_weeders.unwrap_or(0),
        v.weeder_deleted
    ));
    out
}

/// What to do after a command.
enum Next {
    Continue,
    Quit,
}

/// `silence <shoot> <percent>`: that share of the shoot's kubelets stop renewing their leases.
fn silence(sb: &Sandbox, shoot: &str, percent: Option<&str>) -> Result<()> {
    let Some(percent) = percent.and_then(|p| p.trim_end_matches('%').parse::<f64>().ok()) else {
        bail!("usage: silence <shoot> <percent>, e.g. silence alpha 80");
    };
    if !(0.0..=100.0).contains(&percent) {
        bail!("percent must be between 0 and 100");
    }
    let nodes = sb.shoot(shoot)?.nodes;
    let n = (percent / 100.0 * nodes as f64).round() as usize;
    sb.journal.marker(
        Some(shoot),
        &format!("silence {percent}%"),
        MarkerKind::Step,
    );
    sb.silence(shoot, n, &format!("you: silence {shoot} {percent}%"))
}

/// Runs one command line.
async fn execute(sb: &Sandbox, line: &str) -> Result<Next> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some((&command, args)) = words.split_first() else {
        return Ok(Next::Continue);
    };
    let shoot_arg = || -> Result<&str> {
        match args.first() {
            Some(s) => {
                sb.shoot(s)?;
                Ok(*s)
            }
            None => bail!("{command} needs a shoot: {}", sb.shoot_names()),
        }
    };
    let mark = |label: &str, shoot: &str| {
        sb.journal.marker(Some(shoot), label, MarkerKind::Step);
    };
    match command {
        "silence" => silence(sb, shoot_arg()?, args.get(1).copied())?,
        "heal" => {
            let shoot = shoot_arg()?;
            mark("heal", shoot);
            sb.heal(shoot, &format!("you: heal {shoot}"))?;
        }
        "stop" => {
            let shoot = shoot_arg()?;
            mark("apiserver stopped", shoot);
            sb.stop_apiserver(shoot).await?;
        }
        "start" => {
            let shoot = shoot_arg()?;
            mark("apiserver started", shoot);
            sb.start_apiserver(shoot).await?;
        }
        "crashloop" => {
            let shoot = shoot_arg()?;
            mark("crashloop", shoot);
            sb.crashloop(shoot, &format!("you: crashloop {shoot}"))
                .await?;
        }
        "etcd-down" => {
            let shoot = shoot_arg()?;
            mark("etcd down", shoot);
            sb.etcd_down(shoot, &format!("you: etcd-down {shoot}"))
                .await?;
        }
        "etcd-up" => {
            let shoot = shoot_arg()?;
            mark("etcd up", shoot);
            sb.etcd_up(shoot, &format!("you: etcd-up {shoot}")).await?;
        }
        "zone-out" | "zone-heal" => {
            let shoot = shoot_arg()?;
            let Some(zone) = args.get(1) else {
                bail!("usage: {command} <shoot> <zone>, e.g. {command} gamma eu-1a");
            };
            if command == "zone-out" {
                mark(&format!("zone-out {zone}"), shoot);
                sb.silence_zone(
                    shoot,
                    zone,
                    &format!("you: zone-out {shoot} {zone} (its NAT gateway fails)"),
                )?;
            } else {
                mark(&format!("zone-heal {zone}"), shoot);
                sb.heal_zone(shoot, zone, &format!("you: zone-heal {shoot} {zone}"))?;
            }
        }
        "status" => sb.journal.say(&status(sb)),
        "help" | "?" => sb.journal.say(&help(sb)),
        "quit" | "exit" | "q" => return Ok(Next::Quit),
        other => bail!("unknown command {other:?}; type help"),
    }
    Ok(Next::Continue)
}

/// Prints the hints, then runs commands from stdin until `quit` or end of input.
pub(crate) async fn run(sb: &Sandbox, dir: &std::path::Path) -> Result<()> {
    print_hints(sb, dir);
    let (tx, mut rx) = mpsc::channel::<String>(16);
    // A plain thread: a blocking read of stdin cannot be cancelled, and tokio's stdin would
    // keep the runtime from shutting down while it waits. The process ends it on exit.
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.blocking_send(line).is_err() {
                    break;
                }
            }
        })?;
    loop {
        let Some(line) = rx.recv().await else {
            sb.journal.say("end of input: quitting");
            return Ok(());
        };
        match execute(sb, &line).await {
            Ok(Next::Continue) => {}
            Ok(Next::Quit) => return Ok(()),
            Err(e) => sb.journal.say(&format!("  error: {e:#}")),
        }
    }
}
