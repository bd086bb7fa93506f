//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics.
//!
//! Every replica is a candidate with an identity `<hostname>_<random>`. A candidate takes the
//! Lease when it is free (no holder: never held, or released on shutdown) or expired, and
//! every write carries the `resourceVersion` it read, so of two candidates racing for the same
//! Lease the apiserver lets only one win (the other gets `409 Conflict`).
//!
//! Expiry is judged on the follower's own monotonic clock, as client-go's `leaderelection`
//! does: a held Lease is expired once `leaseDurationSeconds` have passed since this candidate
//! first *observed* its current record (holder, times, duration, transitions). The leader's
//! `renewTime` is never compared with the local wall clock: nodes' wall clocks may be skewed
//! by more than lease duration − renew deadline (5 s by default), and a follower ahead of the
//! leader by that much would take a Lease that is being renewed (two leaders during a
//! partition). The wall clock only stamps the times we write ([`WallClock`]).
//!
//! The leader renews every retry period. It stops leading when it has not renewed for the
//! renew deadline, measured from the start of its last successful renewal. Because the
//! deadline is shorter than the lease duration, and a follower can only observe a renewal after
//! it started, a leader that can't reach the apiserver gives up (lease duration − renew
//! deadline) before any follower may consider its lease expired, whatever the wall clocks say.
//!
//! We evaluated the crates first: `kube-leader-election` and `kube-coordinate` don't support
//! kube 5; `kube-lease-manager` does, but counts time in whole seconds (no 300 ms retry
//! period), has no renew deadline or retry period (it renews a fixed "grace" before expiry)
//! and panics on invalid timings. The protocol is small, so it lives here, with its timing
//! decisions as pure functions ([`decide`], [`Timings::renewal_overdue`]) under unit tests.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// The Leases' names (gardenlet's deployment names the acting ones; shadow mode's are ours).
pub use dwd_core::gardener::{
    PROBER_LEASE, PROBER_SHADOW_LEASE, WEEDER_LEASE, WEEDER_SHADOW_LEASE,
};

/// The three timing flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How long a lease is valid after its last renewal (`--leader-elect-lease-duration`).
    pub lease_duration: Duration,
    /// How long the leader keeps failing to renew before it stops leading
    /// (`--leader-elect-renew-deadline`).
    pub renew_deadline: Duration,
    /// Interval between attempts to acquire or renew (`--leader-elect-retry-period`).
    pub retry_period: Duration,
}

impl Timings {
    /// Checks lease duration > renew deadline > retry period > 0, which makes a leader give
    /// up before its lease can expire for the others.
    pub fn validate(&self) -> Result<(), String> {
        if self.retry_period.is_zero() {
            return Err("--leader-elect-retry-period must be positive".into());
        }
        if self.renew_deadline <= self.retry_period {
            return Err(format!(
                "--leader-elect-renew-deadline ({:?}) must be longer than --leader-elect-retry-period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "--leader-elect-lease-duration ({:?}) must be longer than --leader-elect-renew-deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        Ok(())
    }

    /// `leaseDurationSeconds` to write: whole seconds, rounded up (a longer lease is safe).
    pub fn lease_duration_seconds(&self) -> i32 {
        let secs = self
            .lease_duration
            .as_secs()
            .saturating_add(u64::from(self.lease_duration.subsec_nanos() > 0))
            .max(1);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }

    /// Whether a leader whose last successful renewal started at `last_renewed` must stop.
    pub(crate) fn renewal_overdue(&self, last_renewed: Instant, now: Instant) -> bool {
        now.saturating_duration_since(last_renewed) >= self.renew_deadline
    }

    /// How long a renewal attempt starting at `now` may take before the deadline passes.
    pub(crate) fn renewal_budget(&self, last_renewed: Instant, now: Instant) -> Duration {
        (last_renewed + self.renew_deadline).saturating_duration_since(now)
    }
}

/// What a candidate does with the Lease it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease: create it, held by us.
    Create,
    /// We hold it: renew (same acquire time and transitions).
    Renew,
    /// It is free or expired: take it (a new acquire time, one more transition).
    TakeOver,
    /// Someone else holds it until `expires` (on our monotonic clock).
    Follow {
        /// The current holder.
        holder: String,
        /// When the holder's lease expires unless its record changes.
        expires: Instant,
    },
}

/// The pure decision of client-go's `tryAcquireOrRenew` for `lease` read at `now`, whose
/// record this candidate first observed at `observed_at` (both on its monotonic clock).
pub fn decide(
    lease: Option<&Lease>,
    identity: &str,
    observed_at: Instant,
    now: Instant,
) -> Decision {
    let Some(lease) = lease else {
        return Decision::Create;
    };
    let Some(spec) = lease.spec.as_ref() else {
        return Decision::TakeOver;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return Decision::TakeOver;
    }
    if holder == identity {
        return Decision::Renew;
    }
    // The record's own duration, as client-go: the holder says how long its renewals last.
    let valid_for = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs);
    match valid_for.and_then(|d| observed_at.checked_add(d)) {
        Some(expires) if now <= expires => Decision::Follow {
            holder: holder.to_string(),
            expires,
        },
        // Unchanged for its duration, or a record without a duration: nobody is renewing.
        _ => Decision::TakeOver,
    }
}

/// The wall clock that stamps the `acquireTime` and `renewTime` we write (for humans and
/// other tools; expiry is never judged by it). Injectable so tests can skew a candidate.
pub type WallClock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// The Lease record last observed and when it was first observed (our monotonic clock).
#[derive(Debug, Clone)]
struct Observed {
    record: Option<LeaseSpec>,
    at: Instant,
}

/// The Lease to write for `decision` (not `Follow`), based on what was read.
pub(crate) fn next_lease(
    read: Option<&Lease>,
    decision: &Decision,
    identity: &str,
    duration_seconds: i32,
    namespace: &str,
    name: &str,
    now: Timestamp,
) -> Lease {
    let mut lease = read.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        spec: None,
    });
    let old = lease.spec.take().unwrap_or_default();
    let (acquire_time, transitions) = match decision {
        Decision::Renew => (
            old.acquire_time.unwrap_or(MicroTime(now)),
            old.lease_transitions.unwrap_or(0),
        ),
        Decision::TakeOver => (
            MicroTime(now),
            old.lease_transitions.unwrap_or(0).saturating_add(1),
        ),
        Decision::Create | Decision::Follow { .. } => (MicroTime(now), 0),
    };
    lease.spec = Some(LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(duration_seconds),
        acquire_time: Some(acquire_time),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..old
    });
    lease
}

/// The Lease released by its holder on shutdown: no holder, so the next candidate to look
/// takes it at once; a 1 s duration like client-go's `ReleaseOnCancel` for older readers.
pub(crate) fn released_lease(held: &Lease, now: Timestamp) -> Lease {
    let mut lease = held.clone();
    let old = lease.spec.take().unwrap_or_default();
    lease.spec = Some(LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        ..old
    });
    lease
}

/// This replica's identity: `<hostname>_<random UUID>`, like controller-runtime's.
pub(crate) fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "dependency-watchdog".to_string());
    let r: u128 = rand::random();
    // A version-4 UUID: version and variant bits set, the rest random.
    let r = (r & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
    let hex = format!("{r:032x}");
    format!(
        "{host}_{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The result of one attempt to acquire or renew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// We hold the Lease now.
    Leading,
    /// Someone else holds a valid Lease.
    Following {
        /// The holder.
        holder: String,
    },
    /// Another candidate wrote the Lease between our read and our write.
    LostRace,
}

/// Why a leader stopped leading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost(pub String);

/// One candidate for one Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    timings: Timings,
    /// The Lease as we last wrote it while leading: a renewal replaces it directly, so it
    /// costs one request, and a `409` tells us someone else wrote in between.
    held: Option<Lease>,
    /// The holder last seen, to log changes only.
    last_holder: Option<String>,
    /// The record last read or written, and since when: what expiry is judged by.
    observed: Option<Observed>,
    /// Stamps the times we write.
    wall: WallClock,
}

impl LeaderElector {
    /// A candidate named `identity` for Lease `namespace/name`. `client` should not be shared
    /// with busy work: renewals must not wait behind it in a client-side rate limiter.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: String,
        timings: Timings,
    ) -> Self {
        LeaderElector {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity,
            timings,
            held: None,
            last_holder: None,
            observed: None,
            wall: Arc::new(Timestamp::now),
        }
    }

    /// The same candidate stamping the times it writes with `wall` instead of the system's
    /// wall clock (tests skew it; expiry does not depend on it).
    pub fn with_wall_clock(mut self, wall: WallClock) -> Self {
        self.wall = wall;
        self
    }

    /// When the record `lease` holds was first observed: now, unless it is the record
    /// observed last (client-go's `observedRecord`/`observedTime`).
    fn observe(&mut self, lease: Option<&Lease>, now: Instant) -> Instant {
        let record = lease.and_then(|l| l.spec.clone());
        match &self.observed {
            Some(o) if o.record == record => o.at,
            _ => {
                self.observed = Some(Observed { record, at: now });
                now
            }
        }
    }

    /// This candidate's identity (the `holderIdentity` it writes).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The Lease's name (the `name` label of `leader_election_master_status`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `namespace/name` of the Lease.
    pub fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether a 409 from the apiserver (create: exists; replace: stale resourceVersion).
    fn is_conflict(e: &kube::Error) -> bool {
        matches!(e, kube::Error::Api(s) if s.code == 409)
    }

    /// One round of client-go's `tryAcquireOrRenew`.
    pub(crate) async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let pp = PostParams::default();
        let secs = self.timings.lease_duration_seconds();
        // A clone, not `take()`: this future may be dropped mid-request (shutdown, timeout),
        // and `release` needs the held copy afterwards (a stale copy only costs a re-read).
        if let Some(held) = self.held.clone() {
            let next = next_lease(
                Some(&held),
                &Decision::Renew,
                &self.identity,
                secs,
                &self.namespace,
                &self.name,
                (self.wall)(),
            );
            match self.api.replace(&self.name, &pp, &next).await {
                Ok(written) => {
                    self.observe(Some(&written), Instant::now());
                    self.held = Some(written);
                    return Ok(Attempt::Leading);
                }
                // Our copy is stale (someone wrote, or our last write's answer was lost):
                // read the Lease and decide again below.
                Err(e) if Self::is_conflict(&e) => self.held = None,
                Err(e) => return Err(e),
            }
        }
        let read = self.api.get_opt(&self.name).await?;
        // After the answer: a renewal we observe started before now, so the holder's renew
        // deadline ends before the expiry we count from here.
        let now = Instant::now();
        let observed_at = self.observe(read.as_ref(), now);
        let decision = decide(read.as_ref(), &self.identity, observed_at, now);
        if let Decision::Follow { holder, .. } = decision {
            return Ok(Attempt::Following { holder });
        }
        let next = next_lease(
            read.as_ref(),
            &decision,
            &self.identity,
            secs,
            &self.namespace,
            &self.name,
            (self.wall)(),
        );
        let written = match decision {
            Decision::Create => self.api.create(&pp, &next).await,
            _ => self.api.replace(&self.name, &pp, &next).await,
        };
        match written {
            Ok(written) => {
                self.observe(Some(&written), Instant::now());
                self.held = Some(written);
                Ok(Attempt::Leading)
            }
            Err(e) if Self::is_conflict(&e) => Ok(Attempt::LostRace),
            Err(e) => Err(e),
        }
    }

    fn note_holder(&mut self, holder: &str) {
        if self.last_holder.as_deref() != Some(holder) {
            info!(lease = %self.lease(), %holder, identity = %self.identity, "following the current leader");
            self.last_holder = Some(holder.to_string());
        }
    }

    /// Tries every retry period until this candidate leads; returns when the successful
    /// attempt started (the start of its leadership's renew deadline). Calls `participating`
    /// after every answer from the apiserver (readiness: followers are ready too).
    pub async fn acquire(&mut self, participating: impl Fn()) -> Instant {
        loop {
            let started = Instant::now();
            match tokio::time::timeout(self.timings.renew_deadline, self.try_acquire_or_renew())
                .await
            {
                Ok(Ok(Attempt::Leading)) => {
                    participating();
                    info!(lease = %self.lease(), identity = %self.identity, "became leader");
                    return started;
                }
                Ok(Ok(Attempt::Following { holder })) => {
                    participating();
                    self.note_holder(&holder);
                }
                Ok(Ok(Attempt::LostRace)) => {
                    participating();
                    debug!(lease = %self.lease(), "another candidate took the lease first");
                }
                Ok(Err(e)) => {
                    warn!(lease = %self.lease(), error = %e, "cannot read or acquire the leader-election lease")
                }
                Err(_) => {
                    warn!(lease = %self.lease(), timeout = ?self.timings.renew_deadline, "acquiring the leader-election lease timed out")
                }
            }
            tokio::time::sleep_until(started + self.timings.retry_period).await;
        }
    }

    /// Renews every retry period; returns when leadership is lost: the Lease is held by
    /// someone else, or it could not be renewed within the renew deadline.
    pub async fn keep_leading(&mut self, mut last_renewed: Instant) -> Lost {
        let mut last_attempt = last_renewed;
        loop {
            tokio::time::sleep_until(last_attempt + self.timings.retry_period).await;
            let started = Instant::now();
            last_attempt = started;
            if self.timings.renewal_overdue(last_renewed, started) {
                return self.lost_by_deadline();
            }
            let budget = self.timings.renewal_budget(last_renewed, started);
            match tokio::time::timeout(budget, self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Leading)) => last_renewed = started,
                Ok(Ok(Attempt::Following { holder })) => {
                    self.held = None;
                    return Lost(format!("lease {} is now held by {holder}", self.lease()));
                }
                Ok(Ok(Attempt::LostRace)) => {
                    debug!(lease = %self.lease(), "lease written by someone else while renewing; retrying")
                }
                Ok(Err(e)) => {
                    warn!(lease = %self.lease(), error = %e, "renewing the leader-election lease failed")
                }
                Err(_) => return self.lost_by_deadline(),
            }
        }
    }

    fn lost_by_deadline(&mut self) -> Lost {
        Lost(format!(
            "lease {} not renewed within the renew deadline {:?}",
            self.lease(),
            self.timings.renew_deadline
        ))
    }

    /// Gives the Lease up if we hold it, so a follower takes over at its next attempt instead
    /// of waiting for the lease to expire.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let pp = PostParams::default();
        match self
            .api
            .replace(&self.name, &pp, &released_lease(&held, (self.wall)()))
            .await
        {
            Ok(_) => {}
            // Our copy was stale: release only if the Lease is still ours.
            Err(e) if Self::is_conflict(&e) => {
                let Some(current) = self.api.get_opt(&self.name).await? else {
                    return Ok(());
                };
                let ours = current
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_deref())
                    == Some(self.identity.as_str());
                if !ours {
                    return Ok(());
                }
                self.api
                    .replace(&self.name, &pp, &released_lease(&current, (self.wall)()))
                    .await?;
            }
            Err(e) => return Err(e),
        }
        info!(lease = %self.lease(), identity = %self.identity, "released the leader-election lease");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "host-a_1";
    const OTHER: &str = "host-b_2";

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn lease(holder: Option<&str>, renewed: Option<Timestamp>, duration: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(PROBER_LEASE.into()),
                namespace: Some("garden".into()),
                resource_version: Some("42".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: renewed.map(MicroTime),
                acquire_time: Some(MicroTime(t(-100))),
                lease_duration_seconds: duration,
                lease_transitions: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    fn timings(lease: u64, renew: u64, retry: u64) -> Timings {
        Timings {
            lease_duration: Duration::from_millis(lease),
            renew_deadline: Duration::from_millis(renew),
            retry_period: Duration::from_millis(retry),
        }
    }

    /// Instants `ms` milliseconds after one fixed instant.
    fn mono() -> impl Fn(u64) -> Instant {
        let origin = Instant::now();
        move |ms| origin + Duration::from_millis(ms)
    }

    #[test]
    fn missing_lease_is_created() {
        let at = mono();
        assert_eq!(decide(None, ME, at(0), at(0)), Decision::Create);
    }

    #[test]
    fn free_lease_is_taken_at_once() {
        let at = mono();
        // Released on shutdown: no holder, whatever the times say.
        let l = lease(None, Some(t(0)), Some(15));
        assert_eq!(decide(Some(&l), ME, at(0), at(0)), Decision::TakeOver);
        let l = lease(Some(""), Some(t(0)), Some(15));
        assert_eq!(decide(Some(&l), ME, at(0), at(0)), Decision::TakeOver);
        let mut no_spec = lease(None, None, None);
        no_spec.spec = None;
        assert_eq!(decide(Some(&no_spec), ME, at(0), at(0)), Decision::TakeOver);
    }

    #[test]
    fn others_lease_is_respected_until_its_duration_passed_since_its_record_was_observed() {
        let at = mono();
        // The record's renewTime says nothing: far in the past or the future (a skewed
        // leader), the lease counts from when this candidate first saw the record.
        for renewed in [t(-1_000), t(0), t(1_000)] {
            let l = lease(Some(OTHER), Some(renewed), Some(15));
            for now in [0, 10_000, 15_000] {
                assert_eq!(
                    decide(Some(&l), ME, at(0), at(now)),
                    Decision::Follow {
                        holder: OTHER.into(),
                        expires: at(15_000)
                    },
                    "renewed {renewed}, {now} ms after it was observed"
                );
            }
            let just_after = at(15_000) + Duration::from_micros(1);
            assert_eq!(decide(Some(&l), ME, at(0), just_after), Decision::TakeOver);
            assert_eq!(decide(Some(&l), ME, at(0), at(100_000)), Decision::TakeOver);
        }
    }

    #[test]
    fn others_lease_without_a_duration_is_expired() {
        let at = mono();
        let l = lease(Some(OTHER), Some(t(0)), None);
        assert_eq!(decide(Some(&l), ME, at(0), at(0)), Decision::TakeOver);
        let l = lease(Some(OTHER), Some(t(0)), Some(0));
        assert_eq!(decide(Some(&l), ME, at(0), at(0)), Decision::TakeOver);
        let l = lease(Some(OTHER), Some(t(0)), Some(-5));
        assert_eq!(decide(Some(&l), ME, at(0), at(0)), Decision::TakeOver);
        // Times are not needed: the record's duration and when it was observed are.
        let mut l = lease(Some(OTHER), None, Some(15));
        if let Some(s) = l.spec.as_mut() {
            s.acquire_time = None;
        }
        assert_eq!(
            decide(Some(&l), ME, at(0), at(5_000)),
            Decision::Follow {
                holder: OTHER.into(),
                expires: at(15_000)
            }
        );
    }

    #[test]
    fn own_lease_is_renewed_even_when_expired() {
        let at = mono();
        let l = lease(Some(ME), Some(t(0)), Some(15));
        assert_eq!(decide(Some(&l), ME, at(0), at(5_000)), Decision::Renew);
        assert_eq!(decide(Some(&l), ME, at(0), at(500_000)), Decision::Renew);
    }

    #[test]
    fn written_lease_keeps_resource_version_and_counts_transitions() {
        let read = lease(Some(OTHER), Some(t(0)), Some(15));
        let taken = next_lease(
            Some(&read),
            &Decision::TakeOver,
            ME,
            2,
            "garden",
            PROBER_LEASE,
            t(20),
        );
        assert_eq!(
            taken.metadata.resource_version.as_deref(),
            Some("42"),
            "optimistic concurrency"
        );
        let spec = taken.spec.unwrap_or_default();
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.acquire_time, Some(MicroTime(t(20))));
        assert_eq!(spec.renew_time, Some(MicroTime(t(20))));
        assert_eq!(spec.lease_duration_seconds, Some(2));

        let mine = lease(Some(ME), Some(t(0)), Some(15));
        let renewed = next_lease(
            Some(&mine),
            &Decision::Renew,
            ME,
            15,
            "garden",
            PROBER_LEASE,
            t(2),
        );
        let spec = renewed.spec.unwrap_or_default();
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(
            spec.acquire_time,
            Some(MicroTime(t(-100))),
            "acquire time stays"
        );
        assert_eq!(spec.renew_time, Some(MicroTime(t(2))));

        let created = next_lease(
            None,
            &Decision::Create,
            ME,
            15,
            "garden",
            PROBER_LEASE,
            t(0),
        );
        assert_eq!(created.metadata.namespace.as_deref(), Some("garden"));
        assert_eq!(created.metadata.name.as_deref(), Some(PROBER_LEASE));
        assert_eq!(created.metadata.resource_version, None);
        assert_eq!(created.spec.and_then(|s| s.lease_transitions), Some(0));
    }

    #[test]
    fn released_lease_is_free_for_the_next_candidate() {
        let mine = lease(Some(ME), Some(t(0)), Some(15));
        let released = released_lease(&mine, t(1));
        assert_eq!(released.metadata.resource_version.as_deref(), Some("42"));
        let now = Instant::now();
        assert_eq!(decide(Some(&released), OTHER, now, now), Decision::TakeOver);
        let spec = released.spec.unwrap_or_default();
        assert_eq!(spec.lease_duration_seconds, Some(1));
        assert_eq!(spec.lease_transitions, Some(3));
    }

    #[test]
    fn timings_must_let_the_leader_give_up_before_its_lease_expires() {
        assert!(timings(15_000, 10_000, 2_000).validate().is_ok());
        assert!(timings(2_000, 1_500, 300).validate().is_ok());
        assert!(timings(10_000, 10_000, 2_000).validate().is_err());
        assert!(timings(15_000, 2_000, 2_000).validate().is_err());
        assert!(timings(15_000, 10_000, 0).validate().is_err());
    }

    #[test]
    fn lease_duration_seconds_round_up() {
        assert_eq!(timings(15_000, 1, 1).lease_duration_seconds(), 15);
        assert_eq!(timings(1_500, 1, 1).lease_duration_seconds(), 2);
        assert_eq!(timings(200, 1, 1).lease_duration_seconds(), 1);
    }

    #[test]
    fn renewal_is_overdue_once_the_deadline_passed_since_the_last_success() {
        let tm = timings(2_000, 1_500, 300);
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        assert!(!tm.renewal_overdue(start, at(0)));
        assert!(!tm.renewal_overdue(start, at(1_499)));
        assert!(tm.renewal_overdue(start, at(1_500)));
        assert_eq!(
            tm.renewal_budget(start, at(1_000)),
            Duration::from_millis(500)
        );
        assert_eq!(tm.renewal_budget(start, at(2_000)), Duration::ZERO);
    }

    #[test]
    fn identity_is_hostname_underscore_uuid() {
        let a = default_identity();
        let b = default_identity();
        assert_ne!(a, b, "two replicas on one host differ");
        let (host, uuid) = a.rsplit_once('_').unwrap_or_default();
        assert!(!host.is_empty(), "{a}");
        let parts: Vec<usize> = uuid.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{a}");
        assert_eq!(uuid.as_bytes()[14], b'4', "version 4: {a}");
    }

    /// The elector against the fake seed apiserver ([`crate::fake_seed`]) on a paused clock:
    /// the retry period, the renew deadline, the instants of the elector's requests and the
    /// expiry of a lease (judged on the same monotonic clock) are exact. The wall clock that
    /// stamps `renewTime` does not move with the paused clock; a candidate's can be skewed
    /// ([`LeaderElector::with_wall_clock`]).
    mod elector {
        use super::*;
        use crate::fake_seed::{Call, FakeSeed, Outage, held_lease};
        use k8s_openapi::jiff::SignedDuration;
        use std::cell::Cell;

        const NS: &str = "garden";
        const SECOND: Duration = Duration::from_secs(1);

        /// A candidate with the flags' default timings: lease 15 s, renew deadline 10 s, retry
        /// period 2 s.
        fn candidate(fake: &FakeSeed, identity: &str) -> LeaderElector {
            LeaderElector::new(
                fake.client(),
                NS,
                PROBER_LEASE,
                identity.to_string(),
                timings(15_000, 10_000, 2_000),
            )
        }

        fn stored(fake: &FakeSeed) -> Lease {
            fake.lease(NS, PROBER_LEASE).expect("lease stored")
        }

        fn spec(lease: &Lease) -> LeaseSpec {
            lease.spec.clone().expect("lease spec")
        }

        fn version(lease: &Lease) -> String {
            lease.metadata.resource_version.clone().expect("version")
        }

        /// (method, time since `start`, status) of each request for the Lease.
        fn requests(fake: &FakeSeed, start: Instant) -> Vec<(String, Duration, u16)> {
            fake.calls_to("/leases")
                .iter()
                .map(|c| (c.method.to_string(), c.at - start, c.status))
                .collect()
        }

        fn at(method: &str, secs: u64, status: u16) -> (String, Duration, u16) {
            (method.to_string(), Duration::from_secs(secs), status)
        }

        /// The requests of a candidate creating the missing Lease at 0 s.
        fn created_at_0() -> [(String, Duration, u16); 2] {
            [at("GET", 0, 404), at("POST", 0, 201)]
        }

        /// Renewals at `secs` answered `status`.
        fn puts(status: u16, secs: &[u64]) -> Vec<(String, Duration, u16)> {
            secs.iter().map(|s| at("PUT", *s, status)).collect()
        }

        /// A write of a stale copy at `secs`, refused, and the read that follows.
        fn conflict_then_read_at(secs: u64) -> [(String, Duration, u16); 2] {
            [at("PUT", secs, 409), at("GET", secs, 200)]
        }

        /// The writes of the Lease.
        fn lease_writes(fake: &FakeSeed) -> Vec<Call> {
            fake.writes()
                .into_iter()
                .filter(|c| c.path.contains("/leases"))
                .collect()
        }

        /// The resourceVersion a write was conditional on.
        fn precondition(call: &Call) -> Option<String> {
            call.body["metadata"]["resourceVersion"]
                .as_str()
                .map(str::to_string)
        }

        fn holder_written(call: &Call) -> Option<String> {
            call.body["spec"]["holderIdentity"]
                .as_str()
                .map(str::to_string)
        }

        /// A Lease held by `holder`, renewed now (by the wall clock) for 15 s.
        fn held_by(holder: &str) -> Lease {
            held_lease(NS, PROBER_LEASE, holder)
        }

        /// The Lease requests after `me` created the Lease at `start`, once it kept leading
        /// for `length` (asserted) from then.
        async fn renewals_while_still_leading(
            fake: &FakeSeed,
            me: &mut LeaderElector,
            start: Instant,
            length: Duration,
        ) -> Vec<(String, Duration, u16)> {
            let leading = tokio::time::timeout(length, me.keep_leading(start)).await;
            assert!(leading.is_err(), "still leading: {leading:?}");
            requests(fake, start)[2..].to_vec()
        }

        /// `me` leads, having created the Lease at `start`.
        async fn leading(fake: &FakeSeed) -> (LeaderElector, Instant) {
            let mut me = candidate(fake, ME);
            let start = Instant::now();
            assert_eq!(me.acquire(|| {}).await, start);
            (me, start)
        }

        #[tokio::test(start_paused = true)]
        async fn a_missing_lease_is_created_and_renewed_every_retry_period_with_one_request() {
            let fake = FakeSeed::default();
            let mut me = candidate(&fake, ME);
            let start = Instant::now();
            let answers = Cell::new(0);
            let started = me.acquire(|| answers.set(answers.get() + 1)).await;
            assert_eq!(started, start);
            assert_eq!(
                answers.get(),
                1,
                "participating once the apiserver answered"
            );
            let created = stored(&fake);
            let s = spec(&created);
            assert_eq!(s.holder_identity.as_deref(), Some(ME));
            assert_eq!(s.lease_duration_seconds, Some(15));
            assert_eq!(s.lease_transitions, Some(0));

            // Still leading 7 s later: renewed at 2, 4 and 6 s, each with one PUT of the copy
            // last written (no read), conditional on the version that write produced.
            assert_eq!(
                renewals_while_still_leading(&fake, &mut me, started, 7 * SECOND).await,
                puts(200, &[2, 4, 6])
            );
            assert_eq!(requests(&fake, start)[..2], created_at_0());
            let writes = lease_writes(&fake);
            assert_eq!(precondition(&writes[0]), None, "a create names no version");
            let first: u64 = version(&created).parse().expect("numeric version");
            for (i, renewal) in writes[1..].iter().enumerate() {
                let expected = if i == 0 {
                    version(&created)
                } else {
                    // The version the previous renewal produced.
                    (first + i as u64).to_string()
                };
                assert_eq!(precondition(renewal), Some(expected), "{renewal:?}");
            }
            let renewed = stored(&fake);
            let s = spec(&renewed);
            assert_eq!(s.holder_identity.as_deref(), Some(ME));
            assert_eq!(
                s.acquire_time,
                spec(&created).acquire_time,
                "a renewal keeps the acquire time"
            );
            assert_eq!(s.lease_transitions, Some(0));
            assert!(s.renew_time >= spec(&created).renew_time);
            assert_eq!(version(&renewed), (first + 3).to_string());
        }

        /// A Lease held by `holder` whose record says it was renewed `secs` after a fixed
        /// wall-clock instant (each `secs` a different record).
        fn renewed_by(holder: &str, secs: i64) -> Lease {
            let mut lease = held_by(holder);
            if let Some(s) = lease.spec.as_mut() {
                s.renew_time = Some(MicroTime(t(secs)));
            }
            lease
        }

        #[tokio::test(start_paused = true)]
        async fn a_follower_waits_while_the_holder_renews_and_takes_over_once_it_expired() {
            let fake = FakeSeed::default();
            fake.put_lease(&renewed_by(OTHER, 0));
            let start = Instant::now();
            let answers = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let task = tokio::spawn({
                let fake = fake.clone();
                let answers = answers.clone();
                async move {
                    let mut me = candidate(&fake, ME);
                    let started = me
                        .acquire(|| {
                            answers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        })
                        .await;
                    (me, started)
                }
            });
            // The holder renews at 5 s, then never again (it crashed without releasing). The
            // follower first sees that record at 6 s: it expires at 21 s on its clock, though
            // the record's renewTime (a fixed past instant) was long over by the wall clock.
            tokio::time::sleep(5 * SECOND).await;
            let renewed = fake.put_lease(&renewed_by(OTHER, 5));
            tokio::time::sleep(16 * SECOND).await;
            assert_eq!(
                requests(&fake, start),
                (0..=10).map(|i| at("GET", 2 * i, 200)).collect::<Vec<_>>(),
                "reads every retry period, writes nothing"
            );
            assert_eq!(answers.load(std::sync::atomic::Ordering::Relaxed), 11);

            let (_me, started) = task.await.expect("candidate");
            assert_eq!(started - start, 22 * SECOND, "at the next retry period");
            assert_eq!(
                requests(&fake, start)[11..],
                [at("GET", 22, 200), at("PUT", 22, 200)]
            );
            let writes = lease_writes(&fake);
            assert_eq!(
                precondition(&writes[0]),
                Some(renewed),
                "conditional on what was read"
            );
            let s = spec(&stored(&fake));
            assert_eq!(s.holder_identity.as_deref(), Some(ME));
            assert_eq!(s.lease_transitions, Some(4), "one more transition");
            assert_eq!(s.lease_duration_seconds, Some(15));
        }

        #[tokio::test(start_paused = true)]
        async fn a_follower_with_a_skewed_wall_clock_never_takes_a_renewed_lease_and_takes_an_abandoned_one_in_time()
         {
            for skew in [30_i64, -30] {
                let fake = FakeSeed::default();
                let (mut me, start) = leading(&fake).await;
                let wall: WallClock = Arc::new(move || {
                    Timestamp::now()
                        .checked_add(SignedDuration::from_secs(skew))
                        .expect("skewed time")
                });
                let follower = tokio::spawn({
                    let fake = fake.clone();
                    async move {
                        let mut other = candidate(&fake, OTHER).with_wall_clock(wall);
                        other.acquire(|| {}).await
                    }
                });
                // The leader renews until 39 s (last at 38 s), then crashes without releasing.
                let leading = tokio::time::timeout(39 * SECOND, me.keep_leading(start)).await;
                assert!(
                    leading.is_err(),
                    "skew {skew} s: the leader lost the lease it renewed (two leaders): {leading:?}"
                );
                assert!(!follower.is_finished(), "skew {skew} s: two leaders");
                drop(me);
                // The last renewal is observed at 38 s (or by the read at 40 s) and expires
                // 15 s later; the follower takes over at its next retry.
                let taken = tokio::time::timeout(60 * SECOND, follower)
                    .await
                    .map(|f| f.expect("follower") - start);
                assert!(
                    taken
                        .as_ref()
                        .is_ok_and(|t| (53 * SECOND..=56 * SECOND).contains(t)),
                    "skew {skew} s: the abandoned lease taken after {taken:?}, not 53-56 s"
                );
                let s = spec(&stored(&fake));
                assert_eq!(s.holder_identity.as_deref(), Some(OTHER));
                // Its writes carry its own (skewed) wall clock.
                let written = s.renew_time.expect("renewTime").0;
                let off =
                    written.duration_since(Timestamp::now()) - SignedDuration::from_secs(skew);
                assert!(
                    off.abs() < SignedDuration::from_secs(5),
                    "skew {skew} s: {off:?}"
                );
            }
        }

        #[tokio::test(start_paused = true)]
        async fn a_leader_whose_renewals_fail_stops_at_the_renew_deadline_before_its_lease_expires()
        {
            let fake = FakeSeed::default();
            let (mut me, start) = leading(&fake).await;
            fake.outage(Outage::Fail(500), 60 * SECOND);
            let Lost(reason) = me.keep_leading(start).await;
            let lost_at = Instant::now() - start;
            assert_eq!(
                lost_at,
                10 * SECOND,
                "the renew deadline after the last renewal"
            );
            assert!(
                lost_at < 15 * SECOND,
                "before the lease expires for the others"
            );
            assert!(
                reason.contains("not renewed within the renew deadline 10s"),
                "{reason}"
            );
            assert_eq!(
                requests(&fake, start),
                [created_at_0().as_slice(), &puts(500, &[2, 4, 6, 8])].concat(),
                "no attempt once the deadline has passed"
            );
        }

        #[tokio::test(start_paused = true)]
        async fn a_partitioned_leader_stops_at_the_renew_deadline_while_its_renewal_hangs() {
            let fake = FakeSeed::default();
            let (mut me, start) = leading(&fake).await;
            fake.outage(Outage::Hang, 60 * SECOND);
            let Lost(reason) = me.keep_leading(start).await;
            assert_eq!(Instant::now() - start, 10 * SECOND);
            assert!(reason.contains("renew deadline"), "{reason}");
            // The renewal at 2 s never got an answer: given up when the deadline passed.
            assert_eq!(
                requests(&fake, start),
                [at("GET", 0, 404), at("POST", 0, 201), at("PUT", 2, 0)]
            );
            assert_eq!(spec(&stored(&fake)).holder_identity.as_deref(), Some(ME));
        }

        #[tokio::test(start_paused = true)]
        async fn the_renew_deadline_counts_from_the_start_of_the_last_successful_renewal() {
            let fake = FakeSeed::default();
            let (mut me, start) = leading(&fake).await;
            // Failing until 5 s, then again from 7 s on.
            fake.outage(Outage::Fail(503), 5 * SECOND);
            tokio::spawn({
                let fake = fake.clone();
                async move {
                    tokio::time::sleep(7 * SECOND).await;
                    fake.outage(Outage::Fail(503), 60 * SECOND);
                }
            });
            let Lost(reason) = me.keep_leading(start).await;
            assert_eq!(Instant::now() - start, 16 * SECOND, "6 s + the deadline");
            assert!(reason.contains("renew deadline"), "{reason}");
            assert_eq!(
                requests(&fake, start)[2..],
                [
                    at("PUT", 2, 503),
                    at("PUT", 4, 503),
                    at("PUT", 6, 200),
                    at("PUT", 8, 503),
                    at("PUT", 10, 503),
                    at("PUT", 12, 503),
                    at("PUT", 14, 503),
                ]
            );
        }

        #[tokio::test(start_paused = true)]
        async fn a_conflict_on_renewal_with_the_lease_still_ours_renews_from_a_fresh_read() {
            let fake = FakeSeed::default();
            let (mut me, start) = leading(&fake).await;
            // Written since (e.g. our last renewal's answer was lost): our copy is stale.
            let current = fake.put_lease(&stored(&fake));
            assert_eq!(
                renewals_while_still_leading(&fake, &mut me, start, 5 * SECOND).await,
                [
                    conflict_then_read_at(2).as_slice(),
                    &[at("PUT", 2, 200), at("PUT", 4, 200)]
                ]
                .concat()
            );
            let writes = lease_writes(&fake);
            assert_eq!(precondition(&writes[2]), Some(current));
            let s = spec(&stored(&fake));
            assert_eq!(s.holder_identity.as_deref(), Some(ME));
            assert_eq!(s.lease_transitions, Some(0), "a renewal, not a takeover");
        }

        #[tokio::test(start_paused = true)]
        async fn a_race_lost_while_renewing_is_tried_again_at_the_next_retry_period() {
            let fake = FakeSeed::default();
            let (mut me, start) = leading(&fake).await;
            // Our renewal conflicts, and so does the write after the fresh read.
            fake.lock().fail_writes.extend([(409, None); 2]);
            assert_eq!(
                renewals_while_still_leading(&fake, &mut me, start, 5 * SECOND).await,
                [
                    conflict_then_read_at(2).as_slice(),
                    &[
                        at("PUT", 2, 409),
                        // No copy held after the lost race: read first.
                        at("GET", 4, 200),
                        at("PUT", 4, 200),
                    ]
                ]
                .concat()
            );
            assert_eq!(spec(&stored(&fake)).holder_identity.as_deref(), Some(ME));
        }

        #[tokio::test(start_paused = true)]
        async fn a_conflict_on_renewal_with_another_holder_is_lost_leadership() {
            let fake = FakeSeed::default();
            let (mut me, start) = leading(&fake).await;
            let theirs = fake.put_lease(&held_by(OTHER));
            let Lost(reason) = me.keep_leading(start).await;
            assert_eq!(Instant::now() - start, 2 * SECOND, "at the first renewal");
            assert_eq!(
                reason,
                format!("lease {NS}/{PROBER_LEASE} is now held by {OTHER}")
            );
            assert_eq!(requests(&fake, start)[2..], conflict_then_read_at(2));
            // Nothing left to release: the other holder's Lease is not touched.
            me.release().await.expect("release");
            assert_eq!(requests(&fake, start).len(), 4);
            assert_eq!(version(&stored(&fake)), theirs);
        }

        #[tokio::test(start_paused = true)]
        async fn release_on_shutdown_hands_the_lease_to_the_next_candidate_at_once() {
            let fake = FakeSeed::default();
            let (mut me, start) = leading(&fake).await;
            let held = version(&stored(&fake));
            tokio::time::sleep(SECOND).await;
            me.release().await.expect("release");
            let writes = lease_writes(&fake);
            assert_eq!(writes.len(), 2, "{writes:?}");
            assert_eq!(writes[1].method, http::Method::PUT);
            assert_eq!(precondition(&writes[1]), Some(held));
            assert_eq!(holder_written(&writes[1]), None);
            let released = spec(&stored(&fake));
            assert_eq!(released.holder_identity, None);
            assert_eq!(released.lease_duration_seconds, Some(1));
            // Released once: a second call has nothing to do.
            me.release().await.expect("release again");
            assert_eq!(lease_writes(&fake).len(), 2);

            // The next candidate takes it at its first attempt, not after the lease duration.
            let mut other = candidate(&fake, OTHER);
            let taken = other.acquire(|| {}).await;
            assert_eq!(taken - start, SECOND);
            let s = spec(&stored(&fake));
            assert_eq!(s.holder_identity.as_deref(), Some(OTHER));
            assert_eq!(s.lease_transitions, Some(1));
            assert_eq!(
                requests(&fake, start)[3..],
                [at("GET", 1, 200), at("PUT", 1, 200)]
            );
        }

        #[tokio::test(start_paused = true)]
        async fn release_with_a_stale_copy_releases_only_a_lease_still_ours() {
            // Still ours, written since: released from a fresh read.
            let fake = FakeSeed::default();
            let (mut me, start) = leading(&fake).await;
            let current = fake.put_lease(&stored(&fake));
            me.release().await.expect("release");
            assert_eq!(
                requests(&fake, start)[2..],
                [conflict_then_read_at(0).as_slice(), &[at("PUT", 0, 200)]].concat()
            );
            assert_eq!(precondition(&lease_writes(&fake)[2]), Some(current));
            assert_eq!(spec(&stored(&fake)).holder_identity, None);

            // Taken by another since: left alone.
            let fake = FakeSeed::default();
            let (mut me, start) = leading(&fake).await;
            let theirs = fake.put_lease(&held_by(OTHER));
            me.release().await.expect("release");
            assert_eq!(requests(&fake, start)[2..], conflict_then_read_at(0));
            assert_eq!(version(&stored(&fake)), theirs);
            assert_eq!(spec(&stored(&fake)).holder_identity.as_deref(), Some(OTHER));
        }

        #[tokio::test(start_paused = true)]
        async fn a_candidate_losing_the_race_to_create_follows_the_winner() {
            let fake = FakeSeed::default();
            // The other candidate creates the Lease between our read and our create (the 409
            // is injected: the fake has no hook between two requests).
            let mut me = candidate(&fake, ME);
            let start = Instant::now();
            fake.lock().fail_writes.push_back((409, None));
            assert_eq!(
                me.try_acquire_or_renew().await.expect("attempt"),
                Attempt::LostRace
            );
            fake.put_lease(&held_by(OTHER));
            assert_eq!(
                me.try_acquire_or_renew().await.expect("attempt"),
                Attempt::Following {
                    holder: OTHER.into()
                }
            );
            assert_eq!(
                requests(&fake, start),
                [at("GET", 0, 404), at("POST", 0, 409), at("GET", 0, 200)]
            );
            // What the apiserver answers such a create.
            let api: Api<Lease> = Api::namespaced(fake.client(), NS);
            match api.create(&PostParams::default(), &held_by(ME)).await {
                Err(kube::Error::Api(s)) => {
                    assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists"));
                }
                other => panic!("a second create must conflict: {other:?}"),
            }
        }
    }
}
