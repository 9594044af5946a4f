//! Leader election through a `coordination.k8s.io` Lease: of several replicas exactly one acts;
//! another takes over within the lease duration when it dies. The leader writes its
//! `--selector` on the Lease ([`sandboxd_crds::lease`]), so `kubectl sandbox` can name the
//! sessions it handles.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use sandboxd_crds::lease::{LABEL, SELECTOR_ANNOTATION};
use tracing::info;

/// One replica's view of the Lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    selector: String,
    duration: Duration,
}

impl Elector {
    /// An elector for the Lease `namespace/name`, of an operator handling the objects of
    /// `selector`.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        selector: &str,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            selector: selector.to_owned(),
            duration,
        }
    }

    /// What the leader publishes in the Lease's metadata: the label it is listed by and its
    /// selector.
    fn publish(&self, meta: &mut ObjectMeta) {
        meta.labels
            .get_or_insert_default()
            .insert(LABEL.to_owned(), "true".to_owned());
        meta.annotations
            .get_or_insert_default()
            .insert(SELECTOR_ANNOTATION.to_owned(), self.selector.clone());
    }

    /// How often to renew: a third of the lease.
    pub fn renew_every(&self) -> Duration {
        self.duration / 3
    }

    /// Takes or renews the Lease; true when this replica holds it now.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let mut metadata = ObjectMeta {
                name: Some(self.name.clone()),
                ..Default::default()
            };
            self.publish(&mut metadata);
            let lease = Lease {
                metadata,
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    info!(identity = %self.identity, "acquired the lease");
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let mine = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(renewed), Some(secs)) => renewed
                .0
                .checked_add(SignedDuration::from_secs(i64::from(secs)))
                .is_ok_and(|end| end < now),
            _ => true,
        };
        if !mine && !expired {
            return Ok(false);
        }
        let mut new = spec.clone();
        new.holder_identity = Some(self.identity.clone());
        new.lease_duration_seconds = Some(seconds);
        new.renew_time = Some(MicroTime(now));
        if !mine {
            new.acquire_time = Some(MicroTime(now));
            new.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        lease.spec = Some(new);
        self.publish(&mut lease.metadata);
        // The resourceVersion in the object makes this a compare-and-swap.
        match self
            .api
            .replace(&lease.name_any(), &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                if !mine {
                    info!(identity = %self.identity, previous = ?spec.holder_identity, "took over the lease");
                }
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}
