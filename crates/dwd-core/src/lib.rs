//! Pure decision logic of the dependency watchdog.
//!
//! Everything here is a function of its inputs: configuration parsing and validation, the probe
//! lifecycle rules, lease verdicts, scaling plans and the weeder's rules. No API calls, no async
//! runtime, no clock reads (`now` is always a parameter). Keeping the decisions out of the
//! controller makes every rule of the behaviour contract unit-testable and lets `explain` show the
//! exact verdicts the prober acts on.

#![forbid(unsafe_code)]

pub mod config;
pub mod duration;
pub mod gardener;
pub mod hysteresis;
pub mod intent;
pub mod lease;
pub mod record;
pub mod scaling;
pub mod schedule;
pub mod selector;
pub mod shadow;
pub mod shoot;
pub mod verdict;
pub mod weeder;
pub mod zone;

pub use config::prober::{DependentResourceInfo, ProberConfig, ResourceRef, ScaleInfo};
pub use config::weeder::{DependantSelectors, WeederConfig};
pub use config::{ConfigError, FieldProblem, Loaded};
pub use duration::{DurationError, format_go_duration, parse_go_duration};
pub use hysteresis::{Direction, Hysteresis};
pub use lease::{
    ConditionView, ExclusionReason, LeaseDecision, LeaseReport, MachineView, NoScalingReason,
    NodeLeaseView, NodeVerdict, NodeView, UpReason, Verdict, evaluate_leases, leases_alone_suffice,
};
pub use scaling::{ScalingError, TargetAction, TargetSnapshot};
pub use selector::{PodSelector, SelectorError};
pub use shoot::{EffectiveProbeSettings, ProbeLifecycle, ShootError, ShootView, probe_lifecycle};
pub use zone::{ZONE_LABEL, ZoneReport, ZoneRule};
