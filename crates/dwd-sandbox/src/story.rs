//! The scripted story: all healthy; a NAT outage in `alpha` makes the prober scale its
//! controllers down level by level (Gardener's: MCM and CA, then KCM) while `beta` is left
//! alone; the outage ends and the controllers come back to their recorded replicas (KCM, MCM
//! after its scale-up delay, CA); `alpha`'s etcd goes down, its kube-apiserver pods
//! crash-loop and so does the kube-scheduler that needs them; the moment etcd is back the
//! weeder deletes the kube-apiserver pods, and once the kube-apiserver is back, the
//! kube-scheduler pod (the two services of Gardener's weeder config); then one zone of
//! `gamma` (three zones of two nodes) loses its NAT gateway: the zone is disrupted while the
//! shoot as a whole stays below the threshold, and the zonal protection the sandbox adds
//! scales only MCM and CA down (KCM untouched); the zone heals and they come back.
//!
//! Every step waits on conditions with deadlines and checks what the watchdog did; the only
//! fixed pauses are short *holds* that show a steady state (and check it stays steady).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::config::{ETCD_SERVICE, KUBE_APISERVER_SERVICE, SandboxConfig};
use crate::monitor::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION, ShootView, View};
use crate::sandbox::{Crashlooped, KUBE_APISERVER_PODS, KUBE_SCHEDULER_PODS, Sandbox};

const ALPHA: &str = "alpha";
const BETA: &str = "beta";
const GAMMA: &str = "gamma";
/// The zone of gamma that loses its NAT gateway.
const ZONE: &str = "eu-1a";
/// Kubelets of alpha the NAT outage cuts off (of 5).
const SILENCED: usize = 4;
/// The controllers' replicas as created.
const INITIAL: [(&str, i32); 3] = [
    ("kube-controller-manager", 2),
    ("machine-controller-manager", 1),
    ("cluster-autoscaler", 1),
];
/// Zonal protection: MCM and CA (`scaleDownOnZoneOutage`) at 0, KCM as created.
const ZONAL: [(&str, i32); 3] = [
    ("kube-controller-manager", 2),
    ("machine-controller-manager", 0),
    ("cluster-autoscaler", 0),
];
const ZERO: [(&str, i32); 3] = [
    ("kube-controller-manager", 0),
    ("machine-controller-manager", 0),
    ("cluster-autoscaler", 0),
];

/// Polls `check` on the monitor's view every 100 ms until it returns `Ok`, showing a spinner
/// with `what`; fails after `timeout` with what was expected and what was last seen, or as
/// soon as a watchdog process dies.
pub(crate) async fn wait_for<T>(
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

/// The prober's expired fraction of the shoot is one `ok` accepts.
fn fraction_is(v: &View, name: &str, ok: impl Fn(f64) -> bool) -> Result<(), String> {
    match shoot(v, name)?.fraction {
        Some(f) if ok(f) => Ok(()),
        Some(f) => Err(format!("{name}: fraction {f:.2}")),
        None => Err(format!("{name}: no probe result")),
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

/// Alpha's controllers back at their initial replicas, beta and gamma calm: the state after
/// each of alpha's outages.
fn alpha_restored_others_calm(v: &View) -> Result<(), String> {
    at(v, ALPHA, &INITIAL)?;
    calm(v, BETA)?;
    calm(v, GAMMA)
}

/// When each controller last changed to `to`, after `since`.
fn changed_at(s: &ShootView, controller: &str, to_zero: bool, since: f64) -> Option<f64> {
    s.changes
        .iter()
        .filter(|c| c.t >= since && c.controller == controller && (c.to == 0) == to_zero)
        .map(|c| c.t)
        .next_back()
}

/// Checks that a flow (scale-down when `down`) ran in the config's level order: every
/// controller of a level changed no earlier than every controller of the levels before it,
/// and a scale-up `initialDelay` shows as that much time after the level before.
///
/// With `zonal_only`, only the `scaleDownOnZoneOutage` targets are checked (a zonal flow
/// leaves the others alone).
fn check_level_order(
    config: &SandboxConfig,
    s: &ShootView,
    down: bool,
    since: f64,
    zonal_only: bool,
) -> Result<()> {
    let what = if down { "scale-down" } else { "scale-up" };
    let levels = config.levels(down);
    let mut times = Vec::new();
    for (level, controllers) in &levels {
        let mut at = Vec::new();
        for c in controllers.iter().filter(|c| c.zonal || !zonal_only) {
            let t = changed_at(s, &c.name, down, since)
                .with_context(|| format!("{what}: {} never changed", c.name))?;
            at.push((c, t));
        }
        if !at.is_empty() {
            times.push((*level, at));
        }
    }
    let seen = || {
        times
            .iter()
            .flat_map(|(l, at)| {
                at.iter()
                    .map(move |(c, t)| format!("{} level {l} at {t:.1}s", c.short))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    for pair in times.windows(2) {
        let before = pair[0].1.iter().map(|(_, t)| *t).fold(f64::MIN, f64::max);
        for (c, t) in &pair[1].1 {
            if *t < before {
                bail!(
                    "expected the {what} in level order {}; saw {}",
                    config.flow_text(down),
                    seen()
                );
            }
            // The delay starts when its level starts, after the level before has finished:
            // later than that level's last change. A little slack for the watch's timing.
            let delay = if down { Duration::ZERO } else { c.up_delay };
            if *t - before < delay.as_secs_f64() - 0.5 {
                bail!(
                    "expected {} {:.0}s (its initialDelay) after level {}; saw {}",
                    c.short,
                    delay.as_secs_f64(),
                    pair[0].0,
                    seen()
                );
            }
        }
    }
    Ok(())
}

/// After a scale-down of shoot `name` that started at `since`: checks that it ran in level
/// order and that every controller it scaled (with `zonal_only`, only the
/// `scaleDownOnZoneOutage` targets) carries its recorded replicas in the annotation.
fn check_scaled_down(sb: &Sandbox, name: &str, since: f64, zonal_only: bool) -> Result<()> {
    let v = sb.view();
    let s = shoot(&v, name).map_err(|e| anyhow!(e))?;
    check_level_order(&sb.config, s, true, since, zonal_only)?;
    for (controller, replicas) in INITIAL
        .iter()
        .filter(|(c, _)| !zonal_only || sb.config.controller(c).is_some_and(|c| c.zonal))
    {
        let recorded = s
            .annotations
            .get(*controller)
            .and_then(|an| an.get(REPLICAS_ANNOTATION))
            .cloned();
        if recorded.as_deref() != Some(replicas.to_string().as_str()) {
            bail!(
                "expected {controller} to carry {REPLICAS_ANNOTATION}={replicas}; saw {recorded:?}"
            );
        }
    }
    Ok(())
}

/// Waits until shoot `name`'s controllers are back at their initial replicas and none
/// carries the prober's annotations any more; `who` names them in what is awaited.
async fn wait_restored(sb: &Sandbox, name: &str, who: &str, timeout: Duration) -> Result<()> {
    wait_for(
        sb,
        &format!(
            "{who} restored to their recorded replicas ({}), annotations removed",
            sb.config.flow_text(false)
        ),
        timeout,
        |v| {
            at(v, name, &INITIAL)?;
            let s = shoot(v, name)?;
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
    .await
}

/// Runs the story; returns its duration in seconds.
pub(crate) async fn run(sb: &Sandbox) -> Result<f64> {
    let started = sb.journal.now();
    step1(sb).await.context("step 1/6 (all healthy)")?;
    step2(sb).await.context("step 2/6 (NAT outage in alpha)")?;
    step3(sb).await.context("step 3/6 (the outage ends)")?;
    step4(sb).await.context("step 4/6 (etcd outage in alpha)")?;
    step5(sb).await.context("step 5/6 (zone outage in gamma)")?;
    step6(sb).await.context("step 6/6 (after the fact)")?;
    let took = sb.journal.now() - started;
    sb.journal.log(
        "-",
        format!("story complete in {took:.0}s"),
        Some("alpha protected and restored, beta untouched, crash-looping kube-apiservers restarted as soon as etcd was back and the kube-scheduler as soon as they were, gamma's MCM and CA held at 0 while one zone was cut off and KCM left running, and alpha's scale-down explained from its record afterwards".into()),
    );
    Ok(took)
}

async fn step1(sb: &Sandbox) -> Result<()> {
    sb.journal.step(
        "1 healthy",
        "1/6  all healthy: every kubelet renews its lease",
    );
    wait_for(
        sb,
        "the prober's first lease probe of alpha, beta and gamma",
        Duration::from_secs(30),
        |v| {
            for name in [ALPHA, BETA, GAMMA] {
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
            calm(v, BETA)?;
            calm(v, GAMMA)
        },
    )
    .await?;
    sb.journal.log(
        "-",
        "all healthy: no lease expired, nothing scaled",
        Some(format!(
            "the prober probes every shoot every {}",
            sb.config.probe_interval()
        )),
    );
    Ok(())
}

async fn step2(sb: &Sandbox) -> Result<()> {
    sb.journal.step(
        "2 NAT outage",
        "2/6  NAT outage: alpha loses 4 of its 5 kubelets",
    );
    let threshold = sb.config.threshold();
    let since = sb.journal.now();
    sb.silence(
        ALPHA,
        SILENCED,
        "simulated NAT outage: their node leases are no longer renewed",
    )?;
    wait_for(
        sb,
        &format!("alpha's leases to expire (the prober's expired fraction ≥ {threshold:.2})"),
        Duration::from_secs(30),
        |v| fraction_is(v, ALPHA, |f| f >= threshold),
    )
    .await?;
    wait_for(
        sb,
        &format!(
            "alpha's controllers at 0, level by level: {}",
            sb.config.flow_text(true)
        ),
        Duration::from_secs(40),
        |v| at(v, ALPHA, &ZERO),
    )
    .await?;

    check_scaled_down(sb, ALPHA, since, false)?;
    hold(
        sb,
        "alpha held at 0 while the outage lasts, beta untouched (holding 6s)",
        Duration::from_secs(6),
        |v| {
            at(v, ALPHA, &ZERO)?;
            calm(v, BETA)?;
            calm(v, GAMMA)
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
        "3/6  the outage ends: alpha's kubelets are back",
    );
    let threshold = sb.config.threshold();
    let since = sb.journal.now();
    sb.heal(
        ALPHA,
        "NAT gateway repaired: kubelets reach the API server again",
    )?;
    wait_for(
        sb,
        &format!("alpha's leases to be fresh again (expired fraction < {threshold:.2})"),
        Duration::from_secs(20),
        |v| fraction_is(v, ALPHA, |f| f < threshold),
    )
    .await?;
    wait_restored(sb, ALPHA, "alpha's controllers", Duration::from_secs(40)).await?;
    let v = sb.view();
    let a = shoot(&v, ALPHA).map_err(|e| anyhow!(e))?;
    check_level_order(&sb.config, a, false, since, false)?;
    sb.journal.log(
        ALPHA,
        "fully restored: KCM 2 / MCM 1 / CA 1, the prober's annotations removed",
        None,
    );
    hold(
        sb,
        "alpha and beta healthy again, gamma calm (holding 4s)",
        Duration::from_secs(4),
        alpha_restored_others_calm,
    )
    .await
}

async fn step4(sb: &Sandbox) -> Result<()> {
    sb.journal.step(
        "4 etcd outage",
        "4/6  etcd outage: alpha's kube-apiserver pods crash-loop, and the kube-scheduler with them, until etcd is back",
    );
    let looping = etcd_outage(sb).await?;
    sb.etcd_up(ALPHA, "etcd is back").await?;
    let back = sb.journal.now();
    weeder_deletes_apiservers(sb, &looping.apiservers, back).await?;
    if !looping.dependants.is_empty() {
        weeder_deletes_dependants(sb, &looping.dependants, back).await?;
    }
    replacements_run(sb).await
}

/// Step 4's outage: once the weeders started at setup have ended, alpha's etcd goes down and
/// its kube-apiservers and kube-scheduler crash-loop; the weeder leaves them alone while etcd
/// is down. Returns the crash-looping pods.
async fn etcd_outage(sb: &Sandbox) -> Result<Crashlooped> {
    let watch = sb.config.watch_duration();
    wait_for(
        sb,
        &format!(
            "the weeders started at setup to end (watchDuration {})",
            dwd_core::format_go_duration(watch)
        ),
        watch + Duration::from_secs(15),
        |v| match v.active_weeders {
            Some(0) => Ok(()),
            other => Err(format!("{other:?} active weeders")),
        },
    )
    .await?;
    sb.etcd_down(ALPHA, "simulated etcd outage").await?;
    let looping = sb
        .crashloop(ALPHA, "kube-apiserver cannot reach etcd")
        .await?;
    let all: Vec<String> = looping
        .apiservers
        .iter()
        .chain(&looping.dependants)
        .cloned()
        .collect();
    wait_for(
        sb,
        "the monitor to see the crash loops",
        Duration::from_secs(10),
        |v| {
            let s = shoot(v, ALPHA)?;
            let seen = all
                .iter()
                .filter(|p| s.pods.get(*p).is_some_and(|p| p.crashlooping))
                .count();
            if seen == all.len() {
                Ok(())
            } else {
                Err(format!("{seen} of {} crash-looping", all.len()))
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
        Some(format!(
            "{ETCD_SERVICE} and {KUBE_APISERVER_SERVICE} have no ready endpoint: a restart would crash again"
        )),
    );
    Ok(looping)
}

/// The weeder deletes the crash-looping kube-apiserver pods once etcd is back (at `back`).
async fn weeder_deletes_apiservers(sb: &Sandbox, apiservers: &[String], back: f64) -> Result<()> {
    let deleted_at = wait_deleted(
        sb,
        "the weeder to delete the crash-looping kube-apiserver pods",
        apiservers,
    )
    .await?;
    sb.journal.log(
        ALPHA,
        format!(
            "{} crash-looping kube-apiserver pods deleted {:.1}s after etcd came back",
            if apiservers.len() == 2 {
                "both".to_string()
            } else {
                format!("all {}", apiservers.len())
            },
            (deleted_at - back).max(0.0)
        ),
        Some(
            "without the weeder they would wait out CrashLoopBackOff's back-off of up to 5 minutes"
                .into(),
        ),
    );
    Ok(())
}

/// The weeder deletes the crash-looping `dependants` (the kube-scheduler) once a new
/// kube-apiserver runs and its service is ready again (after etcd came back at `back`).
async fn weeder_deletes_dependants(sb: &Sandbox, dependants: &[String], back: f64) -> Result<()> {
    let apiserver_back = wait_for(
        sb,
        &format!("{KUBE_APISERVER_SERVICE} to be ready again (a new kube-apiserver pod runs)"),
        Duration::from_secs(15),
        |v| {
            let s = shoot(v, ALPHA)?;
            match s.kube_apiserver_ready_since {
                Some(t) if s.kube_apiserver_ready && t >= back => Ok(t),
                _ => Err(format!("{KUBE_APISERVER_SERVICE} not ready")),
            }
        },
    )
    .await?;
    let deleted_at = wait_deleted(
        sb,
        "the weeder to delete the crash-looping kube-scheduler",
        dependants,
    )
    .await?;
    sb.journal.log(
        ALPHA,
        format!(
            "crash-looping {} deleted {:.1}s after {KUBE_APISERVER_SERVICE} was back",
            dependants.join(", "),
            (deleted_at - apiserver_back).max(0.0)
        ),
        Some(format!(
            "Gardener's weeder restarts control-plane pods whose role is neither main nor apiserver once the {KUBE_APISERVER_SERVICE} is back"
        )),
    );
    Ok(())
}

/// Step 4's end: the replacement pods run and alpha is healthy again, the others calm.
async fn replacements_run(sb: &Sandbox) -> Result<()> {
    wait_for(
        sb,
        "the replacement kube-apiserver and kube-scheduler pods to run",
        Duration::from_secs(15),
        |v| {
            let s = shoot(v, ALPHA)?;
            let running = |role: &str| {
                s.pods
                    .values()
                    .filter(|p| p.role == role && !p.deleted && !p.crashlooping)
                    .count()
            };
            let (apiservers, schedulers) = (running("apiserver"), running("scheduler"));
            if apiservers >= KUBE_APISERVER_PODS && schedulers >= KUBE_SCHEDULER_PODS {
                Ok(())
            } else {
                Err(format!(
                    "{apiservers} kube-apiserver and {schedulers} kube-scheduler pods running"
                ))
            }
        },
    )
    .await?;
    hold(
        sb,
        "alpha healthy again, beta and gamma calm (holding 2s)",
        Duration::from_secs(2),
        alpha_restored_others_calm,
    )
    .await
}

/// The zone's state as the prober reported it: `(fraction, disrupted)`.
fn zone_state(v: &View, zone: &str) -> Result<(Option<f64>, bool), String> {
    let s = shoot(v, GAMMA)?;
    let z = s
        .zones
        .get(zone)
        .ok_or_else(|| format!("gamma has no zone {zone}"))?;
    Ok((z.fraction, z.disrupted))
}

/// Whether the timeline has a `reason` event of gamma since `since` (the watchdog's Event on
/// its Cluster, as the monitor narrated it).
fn event_seen(sb: &Sandbox, reason: &str, since: f64) -> Result<(), String> {
    let needle = format!("Event {reason} on the Cluster");
    let seen = sb
        .journal
        .record()
        .entries
        .iter()
        .any(|e| e.t >= since && e.shoot == GAMMA && e.what.contains(&needle));
    if seen {
        Ok(())
    } else {
        Err(format!("no {reason} Event on gamma's Cluster yet"))
    }
}

async fn step5(sb: &Sandbox) -> Result<()> {
    zone_outage(sb).await?;
    zone_recovery(sb).await
}

/// Step 5's outage: gamma's zone [`ZONE`] cut off; its zonal controllers scaled down (and no
/// other), the ZoneDisrupted Event written.
async fn zone_outage(sb: &Sandbox) -> Result<()> {
    let zone_threshold = sb.config.zone_threshold();
    let threshold = sb.config.threshold();
    sb.journal.step(
        "5 zone outage",
        &format!(
            "5/6  zone outage: gamma's zone {ZONE} loses its NAT gateway (2 of its 6 kubelets)"
        ),
    );
    let since = sb.journal.now();
    sb.silence_zone(
        GAMMA,
        ZONE,
        "simulated NAT outage of one zone: its node leases are no longer renewed",
    )?;
    wait_for(
        sb,
        &format!(
            "zone {ZONE} disrupted (its expired fraction ≥ {zone_threshold:.2}) while gamma as a whole stays below {threshold:.2}"
        ),
        Duration::from_secs(30),
        |v| {
            let (f, disrupted) = zone_state(v, ZONE)?;
            let s = shoot(v, GAMMA)?;
            match (f, s.fraction) {
                (Some(_), Some(shoot_f)) if disrupted && shoot_f < threshold => Ok(()),
                (Some(_), Some(shoot_f)) if shoot_f >= threshold => Err(format!(
                    "gamma's shoot-wide fraction {shoot_f:.2} reached the threshold"
                )),
                (f, shoot_f) => Err(format!(
                    "zone {ZONE}: fraction {f:?}, disrupted {disrupted}; gamma: {shoot_f:?}"
                )),
            }
        },
    )
    .await?;
    wait_for(
        sb,
        &format!("gamma's zonal scale-down: {}", sb.config.zonal_flow_text()),
        Duration::from_secs(30),
        |v| at(v, GAMMA, &ZONAL),
    )
    .await?;
    wait_for(
        sb,
        "the ZoneDisrupted Event on gamma's Cluster",
        Duration::from_secs(10),
        |_| event_seen(sb, "ZoneDisrupted", since),
    )
    .await?;
    check_scaled_down(sb, GAMMA, since, true)?;
    hold(
        sb,
        "gamma's MCM and CA held at 0 while the zone is cut off, KCM running, alpha and beta untouched (holding 2s)",
        Duration::from_secs(2),
        |v| {
            at(v, GAMMA, &ZONAL)?;
            at(v, ALPHA, &INITIAL)?;
            calm(v, BETA)
        },
    )
    .await?;
    sb.journal.log(
        GAMMA,
        format!(
            "KCM keeps running: only {} are scaleDownOnZoneOutage",
            sb.config
                .controllers
                .iter()
                .filter(|c| c.zonal)
                .map(|c| c.short.as_str())
                .collect::<Vec<_>>()
                .join(" and ")
        ),
        Some("the zone's machines are not replaced and no new node is ordered into it, while the healthy zones keep their controllers".into()),
    );
    Ok(())
}

/// Step 5's recovery: the zone healed; gamma's zonal controllers restored in level order, the
/// ZoneRecovered Event written, the non-zonal ones never scaled.
async fn zone_recovery(sb: &Sandbox) -> Result<()> {
    let healed = sb.journal.now();
    sb.heal_zone(
        GAMMA,
        ZONE,
        "the zone's NAT gateway repaired: its kubelets reach the API server again",
    )?;
    wait_for(
        sb,
        &format!("zone {ZONE} recovered (the prober no longer reports it disrupted)"),
        Duration::from_secs(20),
        |v| match zone_state(v, ZONE)? {
            (_, false) => Ok(()),
            (f, true) => Err(format!("zone {ZONE} still disrupted at {f:?}")),
        },
    )
    .await?;
    wait_restored(sb, GAMMA, "gamma's MCM and CA", Duration::from_secs(30)).await?;
    wait_for(
        sb,
        "the ZoneRecovered Event on gamma's Cluster",
        Duration::from_secs(10),
        |_| event_seen(sb, "ZoneRecovered", healed),
    )
    .await?;
    let v = sb.view();
    let g = shoot(&v, GAMMA).map_err(|e| anyhow!(e))?;
    check_level_order(&sb.config, g, false, healed, true)?;
    let kcm: Vec<String> = g
        .changes
        .iter()
        .filter(|c| {
            sb.config
                .controller(&c.controller)
                .is_some_and(|c| !c.zonal)
        })
        .map(|c| format!("{} → {} at {:.1}s", c.controller, c.to, c.t))
        .collect();
    if !kcm.is_empty() {
        bail!(
            "expected gamma's non-zonal controllers never scaled; saw {}",
            kcm.join(", ")
        );
    }
    sb.journal.log(
        GAMMA,
        "fully restored: MCM 1 / CA 1, the prober's annotations removed; KCM never scaled",
        None,
    );
    hold(
        sb,
        "everything healthy at the end (holding 2s)",
        Duration::from_secs(2),
        |v| {
            at(v, ALPHA, &INITIAL)?;
            at(v, GAMMA, &INITIAL)?;
            calm(v, BETA)
        },
    )
    .await
}

/// Waits until every pod in `pods` of alpha is deleted; returns when the last one was.
async fn wait_deleted(sb: &Sandbox, what: &str, pods: &[String]) -> Result<f64> {
    wait_for(sb, what, Duration::from_secs(15), |v| {
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
    })
    .await
}

/// The story's end, after the fact: alpha's scale-down found in the prober's log (its
/// decision record) and replayed by `dependency-watchdog explain --record` under a threshold
/// above the fraction alpha reached. The replay is given no kubeconfig, no home and no
/// in-cluster address: it contacts no apiserver, and says "no scale-down".
async fn step6(sb: &Sandbox) -> Result<()> {
    sb.journal.step(
        "6 after the fact",
        "6/6  after the fact: why did alpha scale down, and what would a higher threshold have done?",
    );
    let records = crate::decisions::read(&sb.prober.log);
    let alpha = sb.shoot(ALPHA)?;
    let record =
        crate::decisions::first_scale_down(&records, &alpha.namespace).with_context(|| {
            format!(
                "no record of alpha's scale-down among the {} in the prober's log",
                records.len()
            )
        })?;
    let reached = match &record.body {
        dwd_core::record::RecordBody::Run(run) => run.finding.as_ref().and_then(|f| f.fraction),
        dwd_core::record::RecordBody::Flow(_) => None,
    }
    .context("alpha's scale-down record has no fraction")?;
    // A tenth above what alpha reached (0.80 → 0.90), in hundredths as a config writes it.
    let higher = ((reached * 100.0).round() + 10.0).min(100.0) / 100.0;
    let text = replay_under(sb, &record.id, higher)?;
    let decided = |label: &str| {
        text.lines()
            .find_map(|l| l.trim_start().strip_prefix(label).map(str::trim))
            .unwrap_or_default()
            .to_owned()
    };
    let (then, now) = (decided("decided:"), decided("would decide:"));
    sb.journal.log(
        ALPHA,
        format!("replayed from the prober's log (decision {}): it decided {then}", record.id),
        Some(format!(
            "its record: the finding ({:.2} of the leases expired), the rule, the hysteresis and the targets as the seed showed them",
            reached
        )),
    );
    sb.journal.log(
        ALPHA,
        format!("with nodeLeaseFailureFraction {higher:.2} it would have decided: {now}"),
        Some("explain --record judged the recorded finding again with the prober's own functions, without any apiserver".into()),
    );
    anyhow::ensure!(
        now.starts_with("no scale-down"),
        "the replay under {higher:.2} still scales down:\n{text}"
    );
    Ok(())
}

/// `dependency-watchdog explain --record` of decision `id` from the prober's log, under the
/// prober's config with `nodeLeaseFailureFraction: higher`, with no kubeconfig, home or
/// in-cluster address; its output, shown on screen.
fn replay_under(sb: &Sandbox, id: &str, higher: f64) -> Result<String> {
    let dir = sb
        .prober_config
        .parent()
        .context("the prober config's directory")?;
    let config = dir.join(format!("prober-config-threshold-{higher:.2}.yaml"));
    let mut yaml: String = sb
        .config
        .prober
        .yaml
        .lines()
        .filter(|l| !l.starts_with("nodeLeaseFailureFraction:"))
        .map(|l| format!("{l}\n"))
        .collect();
    yaml.push_str(&format!("nodeLeaseFailureFraction: {higher:.2}\n"));
    std::fs::write(&config, yaml).with_context(|| format!("write {}", config.display()))?;
    let home = tempfile::tempdir().context("an empty home")?;
    let out = std::process::Command::new(&sb.bin)
        .arg("explain")
        .arg(format!("--record={}", sb.prober.log.display()))
        .arg(format!("--id={}", id))
        .arg(format!("--config-file={}", config.display()))
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("HOME", home.path())
        .output()
        .context("run dependency-watchdog explain --record")?;
    let text = String::from_utf8_lossy(&out.stdout);
    sb.journal.say(&format!(
        "$ dependency-watchdog explain --record prober.log --id {} --config-file {}\n{text}",
        id,
        config.display()
    ));
    anyhow::ensure!(
        out.status.success(),
        "explain --record failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text.into_owned())
}
