//! The scripted story: all healthy; a NAT outage in `alpha` makes the prober scale its
//! controllers down level by level while `beta` is left alone; the outage ends and the
//! controllers come back to their recorded replicas; `alpha`'s etcd goes down, its
//! kube-apiserver pods crash-loop, and the weeder deletes them the moment etcd is back.
//!
//! Every step waits on conditions with deadlines and checks what the watchdog did; the only
//! fixed pauses are short *holds* that show a steady state (and check it stays steady).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::monitor::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION, ShootView, View};
use crate::sandbox::{KUBE_APISERVER_PODS, Sandbox};
use crate::watchdog::{CONTROLLERS, THRESHOLD, WATCH_DURATION_SECONDS};

const ALPHA: &str = "alpha";
const BETA: &str = "beta";
/// Kubelets of alpha the NAT outage cuts off (of 5).
const SILENCED: usize = 4;
/// The controllers' replicas as created.
const INITIAL: [(&str, i32); 3] = [
    ("kube-controller-manager", 2),
    ("machine-controller-manager", 1),
    ("cluster-autoscaler", 1),
];
const ZERO: [(&str, i32); 3] = [
    ("kube-controller-manager", 0),
    ("machine-controller-manager", 0),
    ("cluster-autoscaler", 0),
];

/// Polls `check` on the monitor's view every 100 ms until it returns `Ok`, showing a spinner
/// with `what`; fails after `timeout` with what was expected and what was last seen, or as
/// soon as a watchdog process dies.
pub async fn wait_for<T>(
    sb: &Sandbox,
    what: &str,
    timeout: Duration,
    mut check: impl FnMut(&View) -> Result<T, String>,
) -> Result<T> {
    sb.journal.waiting(what, timeout);
    let deadline = Instant::now() + timeout;
    let result = loop {
        if let Err(e) = sb.check_watchdogs() {
            break Err(e);
        }
        let seen = match check(&sb.view()) {
            Ok(v) => break Ok(v),
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            break Err(anyhow!(
                "expected {what} within {}s; saw {seen}",
                timeout.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    sb.journal.done_waiting();
    result
}

/// Holds for `duration` while checking that `invariant` stays true.
async fn hold(
    sb: &Sandbox,
    what: &str,
    duration: Duration,
    mut invariant: impl FnMut(&View) -> Result<(), String>,
) -> Result<()> {
    sb.journal.waiting(what, duration);
    let end = Instant::now() + duration;
    let result = loop {
        if let Err(e) = sb.check_watchdogs() {
            break Err(e);
        }
        if let Err(seen) = invariant(&sb.view()) {
            break Err(anyhow!("expected {what}; saw {seen}"));
        }
        if Instant::now() >= end {
            break Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    sb.journal.done_waiting();
    result
}

fn shoot<'a>(v: &'a View, name: &str) -> Result<&'a ShootView, String> {
    v.shoot(name)
        .ok_or_else(|| format!("no shoot {name} in the view"))
}

/// The shoot's controllers are at `want` (spec and ready).
fn at(v: &View, name: &str, want: &[(&str, i32)]) -> Result<(), String> {
    let s = shoot(v, name)?;
    if s.controllers_at(want) {
        Ok(())
    } else {
        Err(format!("{name}: {}", s.replicas_text()))
    }
}

/// The shoot is calm: no expired lease reported, controllers at their initial replicas, no
/// scale-down ever started.
fn calm(v: &View, name: &str) -> Result<(), String> {
    let s = shoot(v, name)?;
    at(v, name, &INITIAL)?;
    match s.fraction {
        Some(f) if f == 0.0 && s.attempts_down == 0 => Ok(()),
        Some(f) => Err(format!(
            "{name}: fraction {f:.2}, {} scale-down flows",
            s.attempts_down
        )),
        None => Err(format!("{name}: no probe result yet")),
    }
}

/// When each controller last changed to `to`, after `since`.
fn changed_at(s: &ShootView, controller: &str, to_zero: bool, since: f64) -> Option<f64> {
    s.changes
        .iter()
        .filter(|c| c.t >= since && c.controller == controller && (c.to == 0) == to_zero)
        .map(|c| c.t)
        .next_back()
}

/// Runs the story; returns its duration in seconds.
pub async fn run(sb: &Sandbox) -> Result<f64> {
    let started = sb.journal.now();
    step1(sb).await.context("step 1/4 (all healthy)")?;
    step2(sb).await.context("step 2/4 (NAT outage in alpha)")?;
    step3(sb).await.context("step 3/4 (the outage ends)")?;
    step4(sb).await.context("step 4/4 (etcd outage in alpha)")?;
    let took = sb.journal.now() - started;
    sb.journal.log(
        "-",
        format!("story complete in {took:.0}s"),
        Some("alpha protected and restored, beta untouched, crash-looping kube-apiservers restarted as soon as etcd was back".into()),
    );
    Ok(took)
}

async fn step1(sb: &Sandbox) -> Result<()> {
    sb.journal.step(
        "1 healthy",
        "1/4  all healthy: every kubelet renews its lease",
    );
    wait_for(
        sb,
        "the prober's first lease probe of alpha and beta",
        Duration::from_secs(30),
        |v| {
            for name in [ALPHA, BETA] {
                calm(v, name)?;
            }
            if !v.weeder_reachable {
                return Err("weeder metrics unreachable".into());
            }
            Ok(())
        },
    )
    .await?;
    hold(
        sb,
        "all healthy (holding 6s)",
        Duration::from_secs(6),
        |v| {
            calm(v, ALPHA)?;
            calm(v, BETA)
        },
    )
    .await?;
    sb.journal.log(
        "-",
        "all healthy: no lease expired, nothing scaled",
        Some("the prober probes both shoots every second".into()),
    );
    Ok(())
}

async fn step2(sb: &Sandbox) -> Result<()> {
    sb.journal.step(
        "2 NAT outage",
        "2/4  NAT outage: alpha loses 4 of its 5 kubelets",
    );
    let since = sb.journal.now();
    sb.silence(
        ALPHA,
        SILENCED,
        "simulated NAT outage: their node leases are no longer renewed",
    )?;
    wait_for(
        sb,
        &format!("alpha's leases to expire (the prober's expired fraction ≥ {THRESHOLD:.2})"),
        Duration::from_secs(30),
        |v| {
            let s = shoot(v, ALPHA)?;
            match s.fraction {
                Some(f) if f >= THRESHOLD => Ok(()),
                Some(f) => Err(format!("alpha: fraction {f:.2}")),
                None => Err("alpha: no probe result".into()),
            }
        },
    )
    .await?;
    wait_for(
        sb,
        "alpha's controllers at 0, level by level (KCM, then MCM, then CA)",
        Duration::from_secs(40),
        |v| at(v, ALPHA, &ZERO),
    )
    .await?;

    let v = sb.view();
    let a = shoot(&v, ALPHA).map_err(|e| anyhow!(e))?;
    let times: Vec<(&str, Option<f64>)> = CONTROLLERS
        .iter()
        .map(|(c, _, _)| (*c, changed_at(a, c, true, since)))
        .collect();
    let ordered = times
        .windows(2)
        .all(|w| matches!((w[0].1, w[1].1), (Some(x), Some(y)) if x <= y));
    if !ordered {
        bail!("expected scale-down in level order KCM → MCM → CA; saw times {times:?}");
    }
    for (controller, replicas) in INITIAL {
        let recorded = a
            .annotations
            .get(controller)
            .and_then(|an| an.get(REPLICAS_ANNOTATION))
            .cloned();
        if recorded.as_deref() != Some(replicas.to_string().as_str()) {
            bail!(
                "expected {controller} to carry {REPLICAS_ANNOTATION}={replicas}; saw {recorded:?}"
            );
        }
    }
    hold(
        sb,
        "alpha held at 0 while the outage lasts, beta untouched (holding 6s)",
        Duration::from_secs(6),
        |v| {
            at(v, ALPHA, &ZERO)?;
            calm(v, BETA)
        },
    )
    .await?;
    sb.journal.log(
        BETA,
        "untouched: 0/3 leases expired, controllers KCM 2 / MCM 1 / CA 1",
        Some("the prober judges every shoot by its own leases".into()),
    );
    Ok(())
}

async fn step3(sb: &Sandbox) -> Result<()> {
    sb.journal.step(
        "3 outage ends",
        "3/4  the outage ends: alpha's kubelets are back",
    );
    let since = sb.journal.now();
    sb.heal(
        ALPHA,
        "NAT gateway repaired: kubelets reach the API server again",
    )?;
    wait_for(
        sb,
        &format!("alpha's leases to be fresh again (expired fraction < {THRESHOLD:.2})"),
        Duration::from_secs(20),
        |v| {
            let s = shoot(v, ALPHA)?;
            match s.fraction {
                Some(f) if f < THRESHOLD => Ok(()),
                Some(f) => Err(format!("alpha: fraction {f:.2}")),
                None => Err("alpha: no probe result".into()),
            }
        },
    )
    .await?;
    wait_for(
        sb,
        "alpha's controllers restored to their recorded replicas (CA first, then KCM and MCM), annotations removed",
        Duration::from_secs(40),
        |v| {
            at(v, ALPHA, &INITIAL)?;
            let s = shoot(v, ALPHA)?;
            for (c, annotations) in &s.annotations {
                if annotations.contains_key(REPLICAS_ANNOTATION)
                    || annotations.contains_key(MELTDOWN_ANNOTATION)
                {
                    return Err(format!("{c} still carries the prober's annotations"));
                }
            }
            Ok(())
        },
    )
    .await?;
    let v = sb.view();
    let a = shoot(&v, ALPHA).map_err(|e| anyhow!(e))?;
    let ca = changed_at(a, "cluster-autoscaler", false, since);
    for c in ["kube-controller-manager", "machine-controller-manager"] {
        let t = changed_at(a, c, false, since);
        if !matches!((ca, t), (Some(ca), Some(t)) if ca <= t) {
            bail!(
                "expected cluster-autoscaler (level 0) restored before {c} (level 1); saw CA at {ca:?}, {c} at {t:?}"
            );
        }
    }
    sb.journal.log(
        ALPHA,
        "fully restored: KCM 2 / MCM 1 / CA 1, the prober's annotations removed",
        None,
    );
    hold(
        sb,
        "alpha and beta healthy again (holding 4s)",
        Duration::from_secs(4),
        |v| {
            at(v, ALPHA, &INITIAL)?;
            calm(v, BETA)
        },
    )
    .await
}

async fn step4(sb: &Sandbox) -> Result<()> {
    sb.journal.step(
        "4 etcd outage",
        "4/4  etcd outage: alpha's kube-apiserver pods crash-loop until etcd is back",
    );
    wait_for(
        sb,
        &format!("the weeders started at setup to end (watchDuration {WATCH_DURATION_SECONDS}s)"),
        Duration::from_secs(WATCH_DURATION_SECONDS + 15),
        |v| match v.active_weeders {
            Some(0) => Ok(()),
            other => Err(format!("{other:?} active weeders")),
        },
    )
    .await?;
    sb.etcd_down(ALPHA, "simulated etcd outage").await?;
    let pods = sb
        .crashloop(ALPHA, "kube-apiserver cannot reach etcd")
        .await?;
    wait_for(
        sb,
        "the monitor to see the crash loops",
        Duration::from_secs(10),
        |v| {
            let s = shoot(v, ALPHA)?;
            let looping = pods
                .iter()
                .filter(|p| s.pods.get(*p).is_some_and(|p| p.crashlooping))
                .count();
            if looping == pods.len() {
                Ok(())
            } else {
                Err(format!("{looping} of {} crash-looping", pods.len()))
            }
        },
    )
    .await?;
    hold(
        sb,
        "the crash-looping pods left alone while etcd is down (holding 5s)",
        Duration::from_secs(5),
        |v| {
            let s = shoot(v, ALPHA)?;
            match s.deleted.last() {
                Some((_, pod)) => Err(format!("{pod} deleted while etcd was still down")),
                None => Ok(()),
            }
        },
    )
    .await?;
    sb.journal.log(
        ALPHA,
        "the weeder leaves them alone",
        Some("etcd-main-client is not ready: a restart would crash again".into()),
    );
    sb.etcd_up(ALPHA, "etcd is back").await?;
    let back = sb.journal.now();
    let deleted_at = wait_for(
        sb,
        "the weeder to delete the crash-looping kube-apiserver pods",
        Duration::from_secs(15),
        |v| {
            let s = shoot(v, ALPHA)?;
            let times: Vec<f64> = pods
                .iter()
                .filter_map(|p| s.deleted.iter().find(|(_, d)| d == p).map(|(t, _)| *t))
                .collect();
            if times.len() == pods.len() {
                Ok(times.into_iter().fold(0.0, f64::max))
            } else {
                Err(format!("{} of {} deleted", times.len(), pods.len()))
            }
        },
    )
    .await?;
    sb.journal.log(
        ALPHA,
        format!(
            "{} crash-looping kube-apiserver pods deleted {:.1}s after etcd came back",
            if pods.len() == 2 {
                "both".to_string()
            } else {
                format!("all {}", pods.len())
            },
            (deleted_at - back).max(0.0)
        ),
        Some(
            "without the weeder they would wait out CrashLoopBackOff's back-off (up to 5 minutes)"
                .into(),
        ),
    );
    wait_for(
        sb,
        "the replacement kube-apiserver pods to run",
        Duration::from_secs(15),
        |v| {
            let s = shoot(v, ALPHA)?;
            let running = s
                .pods
                .values()
                .filter(|p| p.role == "apiserver" && !p.deleted && !p.crashlooping)
                .count();
            if running >= KUBE_APISERVER_PODS {
                Ok(())
            } else {
                Err(format!("{running} kube-apiserver pods running"))
            }
        },
    )
    .await?;
    hold(
        sb,
        "everything healthy at the end (holding 3s)",
        Duration::from_secs(3),
        |v| {
            at(v, ALPHA, &INITIAL)?;
            calm(v, BETA)
        },
    )
    .await
}
