//! The EndpointSlice watch: starts a weeder when a configured service's slice turns ready.
//!
//! One watch over all namespaces, filtered server-side by the label `kubernetes.io/service-name`
//! to the configured services, so the seed's other slices never reach us. A configured name
//! that cannot be a label value (a space, a `/`, over 63 characters) is left out of the
//! selector ([`slice_selector`]): no object can carry it, so it matches nothing either way,
//! while in the selector it would make the apiserver refuse the whole watch and no service
//! would be weeded. The reference matches client-side, with the same outcome: only that entry
//! is dead. We don't cache the
//! slices: a readiness bit per `namespace/slice` is all the watch's rules
//! (`dwd_core::weeder::SliceWatch`, a stepper: the watch's events in, "start a weeder" out)
//! need, and it keeps memory flat however many shoots the seed hosts.
//!
//! Like the reference's informer, the first list after start reports every slice as created,
//! so a slice that is ready at start starts a weeder. A re-list after the watch lost its place
//! (`410 Gone`) is compared with what we saw before: a known slice is an update, and only an
//! unknown one counts as created, so a re-list does not restart every weeder in the seed.

use std::sync::Arc;

use dwd_core::selector::validate_label_value;
use dwd_core::weeder::{SERVICE_NAME_LABEL, SliceWatch, service_name, slice_is_ready};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_slices};
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

use super::WeederContext;
use super::pods::Weeder;
use super::registry::{StartOutcome, Weeders};
use crate::observe::health::Health;

/// The label selector of the configured services' slices: `kubernetes.io/service-name in (…)`,
/// or `None` when no configured name can be a label value (then no slice can match).
///
/// Only non-empty label values are listed; they need no quoting. The config loader warns about
/// a name that is no valid service name but accepts it, as the reference does, and a name that
/// is no label value could only break the selector: the apiserver refuses a selector with one
/// bad value as a whole, which would leave every service unweeded.
pub(crate) fn slice_selector<'a>(services: impl IntoIterator<Item = &'a String>) -> Option<String> {
    let mut names: Vec<&str> = services
        .into_iter()
        .map(String::as_str)
        .filter(|name| !name.is_empty() && validate_label_value(name).is_ok())
        .collect();
    if names.is_empty() {
        return None;
    }
    names.sort_unstable();
    Some(format!("{SERVICE_NAME_LABEL} in ({})", names.join(",")))
}

fn key_of(slice: &EndpointSlice) -> Option<(String, String)> {
    Some((slice.namespace()?, slice.metadata.name.clone()?))
}

/// Watches the configured services' slices forever (re-listing with back-off after errors),
/// starting weeders; marks `health` ready once the first list is through.
pub(crate) async fn watch(ctx: Arc<WeederContext>, weeders: Arc<Weeders>, health: Arc<Health>) {
    // Ahead of the deletions in the seed budget: a re-watch starved by a storm of deletions
    // would miss the next service to turn ready. (Only this watch: the weeders it starts
    // get the plain seed client and choose their own priorities.)
    let feed = crate::client::cache::feed_client(&ctx.seed);
    let api: Api<EndpointSlice> = Api::all(feed);
    let Some(selector) = slice_selector(ctx.selectors.keys()) else {
        // Every configured name was warned about at load: nothing can match, nothing to watch.
        health.set_ready(true);
        warn!("no configured service name can label an EndpointSlice; the weeder weeds nothing");
        return std::future::pending().await;
    };
    let config = watcher::Config::default().labels(&selector);
    let mut events = watch_slices(api, config).default_backoff().boxed();
    let mut rules = SliceWatch::default();
    loop {
        let event = match events.try_next().await {
            Ok(Some(event)) => event,
            Ok(None) => return,
            Err(e) => {
                // default_backoff() already delays the retry; just report it.
                warn!(error = %e, "endpoint slice watch failed, retrying");
                continue;
            }
        };
        match event {
            Event::Init => rules.list_begins(),
            Event::InitApply(slice) | Event::Apply(slice) => {
                on_slice(&ctx, &weeders, &mut rules, &slice);
            }
            Event::InitDone => {
                rules.list_done();
                if !health.is_ready() {
                    health.set_ready(true);
                    info!(slices = rules.len(), "endpoint slices listed; weeder ready");
                }
            }
            Event::Delete(slice) => {
                if let Some((namespace, name)) = key_of(&slice) {
                    rules.gone(&format!("{namespace}/{name}"));
                }
            }
        }
    }
}

fn on_slice(
    ctx: &WeederContext,
    weeders: &Arc<Weeders>,
    rules: &mut SliceWatch,
    slice: &EndpointSlice,
) {
    let Some((namespace, name)) = key_of(slice) else {
        return;
    };
    let key = format!("{namespace}/{name}");
    let ready = slice_is_ready(slice);
    if !rules.seen(&key, ready) {
        debug!(%namespace, slice = %name, ready, "endpoint slice changed; no weeder to start");
        return;
    }
    // The server filtered by these very services; a slice of another service would mean the
    // filter did not apply, and we start nothing we have no selectors for.
    let Some((service, selectors)) = service_name(slice)
        .and_then(|s| ctx.selectors.get_key_value(s))
        .map(|(s, sel)| (s.clone(), sel.clone()))
    else {
        debug!(%namespace, slice = %name, "endpoint slice of an unconfigured service ignored");
        return;
    };
    let outcome = weeders.start(Weeder {
        namespace: namespace.clone(),
        slice: name.clone(),
        service: service.clone(),
        selectors,
        watch_duration: ctx.watch_duration,
        client: ctx.seed.clone(),
        hands: ctx.hands.clone(),
        claims: ctx.claims.namespace(&namespace),
    });
    let replaced = outcome == StartOutcome::Replaced;
    info!(%namespace, slice = %name, %service, replaced, "service is ready again; weeding its crash-looping dependants");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_names_every_configured_service_sorted() {
        let services = ["kube-apiserver".to_string(), "etcd-main-client".to_string()];
        assert_eq!(
            slice_selector(&services).as_deref(),
            Some("kubernetes.io/service-name in (etcd-main-client,kube-apiserver)")
        );
    }

    #[test]
    fn names_that_cannot_be_label_values_are_left_out_of_the_selector() {
        let long = "a".repeat(64);
        let services = [
            "etcd main".to_string(),
            "kube-apiserver".to_string(),
            "a/b".to_string(),
            long,
            String::new(),
            "-x".to_string(),
            // No valid service name, but a valid label value: a slice could carry it, and the
            // reference would match it.
            "Etcd_1.x".to_string(),
        ];
        assert_eq!(
            slice_selector(&services).as_deref(),
            Some("kubernetes.io/service-name in (Etcd_1.x,kube-apiserver)")
        );
        assert_eq!(slice_selector(&["a b".to_string()]), None);
    }
}
