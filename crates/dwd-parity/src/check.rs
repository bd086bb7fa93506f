//! Checks a timeline against a scenario's expectations (what CI asks of our binary).

use crate::scenario::{Expect, Scenario};
use crate::timeline::{Timeline, short};

/// Every expectation the timeline misses, one line each (empty: all met).
pub fn check(scenario: &Scenario, timeline: &Timeline) -> Vec<String> {
    scenario
        .expect
        .iter()
        .filter_map(|e| check_one(e, timeline).err())
        .collect()
}

fn check_one(expect: &Expect, tl: &Timeline) -> Result<(), String> {
    match expect {
        Expect::Reaches(d, r, from, to) => match tl.first_replicas(d, *r) {
            Some(t) if t >= *from && t <= *to => Ok(()),
            Some(t) => Err(format!(
                "{} reached {r} replicas at {t:.1}s, expected within [{from}, {to}]s",
                short(d)
            )),
            None => Err(format!(
                "{} never reached {r} replicas, expected within [{from}, {to}]s",
                short(d)
            )),
        },
        Expect::Never(d, r) => match tl.first_replicas(d, *r) {
            None => Ok(()),
            Some(t) => Err(format!(
                "{} reached {r} replicas at {t:.1}s, expected never",
                short(d)
            )),
        },
        Expect::ReplicasAtEnd(d, r) => match tl.last_replicas(d) {
            Some(x) if x == *r => Ok(()),
            other => Err(format!(
                "{} ends with {other:?} replicas, expected {r}",
                short(d)
            )),
        },
        Expect::AnnotationAtEnd(d, k, v) => {
            let got = tl.last_annotation(d, k);
            if got.as_deref() == *v {
                Ok(())
            } else {
                Err(format!(
                    "{} annotation {k} ends as {got:?}, expected {v:?}",
                    short(d)
                ))
            }
        }
        Expect::Gap(a, ra, b, rb, min, max) => check_gap(tl, (a, *ra), (b, *rb), (*min, *max)),
        Expect::PodDeleted(p, from, to) => match tl.pod_deleted(p) {
            Some(t) if t >= *from && t <= *to => Ok(()),
            Some(t) => Err(format!(
                "pod {p} deleted at {t:.1}s, expected within [{from}, {to}]s"
            )),
            None => Err(format!(
                "pod {p} never deleted, expected within [{from}, {to}]s"
            )),
        },
        Expect::PodKept(p) => match tl.pod_deleted(p) {
            None => Ok(()),
            Some(t) => Err(format!("pod {p} deleted at {t:.1}s, expected kept")),
        },
        Expect::ExitCode(c) => match tl.exit() {
            Some(Some(x)) if x == *c => Ok(()),
            other => Err(format!("exit {other:?}, expected code {c}")),
        },
        Expect::Warnings(text, min, max) => {
            let n = tl.warnings().iter().filter(|w| w.contains(text)).count();
            if n >= *min && n <= *max {
                Ok(())
            } else {
                Err(format!(
                    "{n} warning lines contain {text:?}, expected {min}..={max}"
                ))
            }
        }
        Expect::LeaseReleasedWithin(secs) => check_lease_released(tl, *secs),
    }
}

/// [`Expect::Gap`]: the time from the first "`a` reaches `ra`" to the first "`b` reaches `rb`"
/// lies within `[min, max]` seconds.
fn check_gap(
    tl: &Timeline,
    (a, ra): (&str, i32),
    (b, rb): (&str, i32),
    (min, max): (f64, f64),
) -> Result<(), String> {
    let (Some(ta), Some(tb)) = (tl.first_replicas(a, ra), tl.first_replicas(b, rb)) else {
        return Err(format!(
            "gap {}→{ra} to {}→{rb}: one of them never happened",
            short(a),
            short(b)
        ));
    };
    let gap = tb - ta;
    if gap >= min && gap <= max {
        Ok(())
    } else {
        Err(format!(
            "{}→{rb} came {gap:.1}s after {}→{ra}, expected within [{min}, {max}]s",
            short(b),
            short(a)
        ))
    }
}

/// [`Expect::LeaseReleasedWithin`]: the Lease has no holder within `secs` of the SIGTERM.
fn check_lease_released(tl: &Timeline, secs: f64) -> Result<(), String> {
    let Some(term) = tl.terminated_at() else {
        return Err("the scenario sent no SIGTERM".to_string());
    };
    match tl.lease_released_after(term) {
        Some(t) if t - term <= secs => Ok(()),
        Some(t) => Err(format!(
            "leader lease released {:.1}s after SIGTERM, expected within {secs}s",
            t - term
        )),
        None => Err(format!(
            "leader lease not released after SIGTERM, expected within {secs}s"
        )),
    }
}
