//! Start-up: CRDs checked, health served, the Lease won, then the four controllers run until
//! a signal (or the Lease is lost, which ends the process so it restarts as a follower).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use kube::Client;
use tracing::{error, info};

use crate::config::Config;
use crate::context::Context;
use crate::http::{Health, serve};
use crate::leader::Elector;
use crate::metrics::Metrics;

/// Runs the operator.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let namespace = config.own_namespace()?.to_owned();
    let client = Client::try_default()
        .await
        .context("no Kubernetes configuration (KUBECONFIG or in-cluster)")?;
    crate::preflight::check_crds(&client).await?;
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let addr = serve(
        config.http_addr,
        Health {
            metrics: metrics.clone(),
            ready: ready.clone(),
        },
    )
    .await
    .with_context(|| format!("cannot listen on {}", config.http_addr))?;
    println!("sandbox-operator serving health on http://{addr}");
    ready.store(true, Ordering::Relaxed);

    let identity = config.identity();
    let elector = Elector::new(
        client.clone(),
        &config.lease_namespace,
        &config.lease_name,
        &identity,
        &config.selector,
        Duration::from_secs(config.lease_seconds),
    );
    info!(%identity, lease = %format!("{}/{}", config.lease_namespace, config.lease_name), "waiting for the lease");
    loop {
        match elector.try_acquire().await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => error!(error = %e, "lease request failed"),
        }
        tokio::select! {
            () = tokio::time::sleep(elector.renew_every()) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
    metrics.leader.set(1);
    info!(%identity, %namespace, egress_credentials = config.egress_credentials, "leading: starting controllers (admin-token Secrets are read only in this namespace)");
    let ctx = Arc::new(Context::new(client.clone(), config.clone(), metrics));
    let caches = crate::context::Caches {
        hosts: cache::<sandboxd_crds::v1alpha1::SandboxHost>(&client, &ctx).await,
        runtimes: cache::<sandboxd_crds::v1alpha1::Runtime>(&client, &ctx).await,
        tombstones: cache::<sandboxd_crds::v1alpha1::Tombstone>(&client, &ctx).await,
    };
    let _ = ctx.caches.set(caches);
    let renew = tokio::spawn(async move {
        let deadline_after = elector.renew_every() * 2;
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(elector.renew_every()).await;
            match elector.try_acquire().await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => {
                    error!("another replica holds the lease; stopping so no two replicas act");
                    std::process::exit(2);
                }
                Err(e) if last_ok.elapsed() > deadline_after => {
                    error!(error = %e, "could not renew the lease in time; stopping so no two replicas act");
                    std::process::exit(2);
                }
                Err(e) => error!(error = %e, "lease renewal failed; retrying"),
            }
        }
    });
    tokio::select! {
        _ = crate::host::run(ctx.clone()) => {}
        _ = crate::runtime::run(ctx.clone()) => {}
        _ = crate::session::run(ctx.clone()) => {}
        _ = crate::tombstone::run(ctx.clone()) => {}
        _ = crate::snapshot::run(ctx.clone()) => {}
        _ = crate::discovery::run(ctx.clone()) => {}
        _ = crate::signer::run(ctx.clone()) => {}
    }
    renew.abort();
    info!("controllers stopped");
    Ok(())
}

/// A reflector store of `K` (with the operator's selector), filled before it is returned.
async fn cache<K>(client: &Client, ctx: &Context) -> kube::runtime::reflector::Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    let (reader, writer) = kube::runtime::reflector::store();
    let stream = kube::runtime::reflector(
        writer,
        kube::runtime::watcher(kube::Api::<K>::all(client.clone()), ctx.watcher_config()),
    )
    .default_backoff()
    .touched_objects();
    tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    let _ = reader.wait_until_ready().await;
    reader
}
