//! Wiring: starts the modules the config enables and stops them on cancellation.

use crate::catalog::{Catalog, SharedCatalog, SharedSources};
use crate::config::{Config, MqttMode, split_host_port};
use crate::meta::store::MetaStore;
use crate::meta::sync::CatalogSync;
use crate::metrics::Metrics;
use crate::{dmi, eventbus, http, manifests};
use anyhow::Context;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use twin::{Store, TwinService};

/// Runs edgecore until `cancel` is triggered.
pub async fn run(
    config: Config,
    cancel: CancellationToken,
    relaunch: Arc<crate::upgrade::Relaunch>,
) -> anyhow::Result<()> {
    rt::bootstrap::raise_nofile_limit();
    // An upgrade under way: this may be the new edgecore on trial (or must roll back now).
    let trial = crate::upgrade::on_start(&config.data_dir, &relaunch, &cancel)?;
    // A first start (no database: no stored result of the manifests to read back) parses them
    // while the databases are created.
    let early = (config.modules.manifests && !config.database().exists())
        .then(|| manifests::parse_early(config.manifests_dir(), config.node_name.clone()));
    // Private: the twins, and the Secrets sent to the node's pods, are kept here.
    rt::fs::private_dir(&config.data_dir).with_context(|| {
        format!(
            "cannot make the data directory {} private",
            config.data_dir.display()
        )
    })?;
    for db in [
        config.database(),
        twin::store::journal_path(&config.database()),
    ] {
        rt::fs::private_database(&db)
            .with_context(|| format!("cannot make {} private", db.display()))?;
    }
    // The manifests' schemas are derived while the databases open.
    if config.modules.manifests && early.is_none() {
        std::thread::spawn(api::manifest::prepare);
    }
    let store = Store::open_with_history(
        &config.database(),
        config.store.synchronous,
        Some(config.history.clone()),
    )
    .await?;
    let twin = TwinService::start(store, config.limits()).await?;
    let metrics = Arc::new(Metrics::default());
    let catalog: SharedCatalog = Arc::new(RwLock::new(Catalog::default()));
    let sources: SharedSources = Arc::default();
    let sync = CatalogSync::new(twin.clone(), catalog.clone());
    let meta = MetaStore::new(twin.store().clone());
    // What the cloud sent before this start (persisted before it was acknowledged): the
    // devices run at once, link or not.
    {
        let mut src = sources.lock().await;
        src.cloud = meta.cloud_objects().await?;
        sync.publish(&src).await;
    }
    let mut tasks = JoinSet::new();
    tracing::info!(node = %config.node_name, data_dir = %config.data_dir.display(), devices = twin.stats().devices.load(std::sync::atomic::Ordering::Relaxed), "edgecore starting");

    // What answers from the stored twins starts first (the broker, the HTTP API); the
    // manifests are then compared with the twins and the mappers' socket opened. `/readyz`
    // says `starting` until all of it is done.
    let mappers: Arc<std::sync::OnceLock<dmi::mappers::Mappers>> = Arc::default();
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Bursts (start-up, a manifest reload, a fold of the twin journal) free memory in the middle
    // of the heap, which glibc keeps; hand it back now and then.
    let stop = cancel.clone();
    tasks.spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(10));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = every.tick() => rt::sys::release_freed(),
            }
        }
    });

    if config.modules.eventbus {
        let (host, port) = split_host_port(&config.mqtt.address, None)?;
        let connection = if config.mqtt.mode == MqttMode::Embedded {
            let addr = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .next()
                .with_context(|| {
                    format!("mqtt.address {} does not resolve", config.mqtt.address)
                })?;
            let limits = eventbus::broker::Limits {
                max_connections: config.mqtt.max_connections,
                max_queued_messages: config.mqtt.max_queued_messages,
                max_queued_bytes: config.mqtt.max_queued_bytes,
                max_inflight_messages: config.mqtt.max_inflight_messages,
            };
            let auth = eventbus::auth::Auth::load(
                config.mqtt.password_file.as_deref(),
                config.mqtt.acl_file.as_deref(),
                config.mqtt.allow_anonymous,
            )?;
            let tls = match &config.mqtt.tls {
                Some(t) => Some(eventbus::broker::TlsListener::load(t).await?),
                None => None,
            };
            let broker = eventbus::broker::start(addr, tls, limits, auth, cancel.clone()).await?;
            let _ = metrics.broker.set(broker.stats.clone());
            // edgecore's own client is in-process: no socket, no MQTT encoding, no acks.
            let link = broker.link(&eventbus::subscriptions(&config.node_name));
            eventbus::Connection::Link(link)
        } else {
            eventbus::Connection::Tcp(eventbus::MqttSettings {
                host,
                port,
                client_id: config.mqtt.client_id.clone(),
                username: config.mqtt.username.clone(),
                password: config.mqtt.password.clone(),
                quick_ack: config.mqtt.quick_ack,
                keep_alive: Duration::from_secs(config.mqtt.keep_alive_seconds.into()),
            })
        };
        tasks.spawn(eventbus::run(
            connection,
            config.node_name.clone(),
            twin.clone(),
            metrics.clone(),
            cancel.clone(),
        ));
    }

    // The alarms kept at the last run, served at once; evaluated once the catalog is read.
    let alarms = crate::alarms::Alarms::load(twin.clone()).await;
    let alarm_changes = sync.subscribe();
    let alarm_events = twin.subscribe();

    // Pods the cloud sent before this start run at once, link or not.
    let cloud_pods = edged::CloudPods::default();
    meta.load_pod_objects(&cloud_pods).await?;
    let pods = config.edged.as_ref().map(|e| {
        let pods = edged::Pods::default();
        let edged = edged::Edged::new(
            e.clone(),
            pods.clone(),
            Some(cloud_pods.clone()),
            &config.node_name,
        );
        tasks.spawn(edged.run(cancel.clone()));
        pods
    });
    let edged_pods = pods.clone();

    if config.modules.http {
        let listener = tokio::net::TcpListener::bind(config.http.address)
            .await
            .with_context(|| format!("cannot listen on http.address {}", config.http.address))?;
        let state = http::ApiState {
            alarms: alarms.clone(),
            node: config.node_name.as_str().into(),
            cloud: config.cloud.is_some(),
            events: http::event_feed(&twin, cancel.clone()),
            stop: cancel.clone(),
            twin: twin.clone(),
            metrics: metrics.clone(),
            mappers: mappers.clone(),
            started: started.clone(),
            pods,
            pod_log_dir: config.edged.as_ref().and_then(|e| e.pod_log_dir.clone()),
            hosts: rt::host::served_names(&config.http.hosts),
            token: match &config.http.token_file {
                None => None,
                Some(f) => {
                    Some(Arc::from(rt::secret::token_file(f).with_context(|| {
                        format!("http.tokenFile {}", f.display())
                    })?))
                }
            },
        };
        tasks.spawn(http::serve(
            listener,
            config.http.max_connections,
            state,
            cancel.clone(),
        ));
    }

    if config.modules.manifests {
        let dir = config.manifests_dir();
        let mut src = sources.lock().await;
        let (seen, read) =
            manifests::reload_at_start(&dir, &config.node_name, &mut src, &meta, early).await;
        let loaded = match read {
            Ok(to_store) => {
                sync.publish(&src).await;
                // Twins of devices no longer declared go: the directory is the source of truth.
                manifests::prune_undeclared(&twin, &catalog).await;
                if let Some(parsed) = to_store {
                    let meta = meta.clone();
                    tasks
                        .spawn(async move { manifests::store_for_next_start(&meta, parsed).await });
                }
                true
            }
            Err(e) => {
                // A missing or unreadable directory is not an empty one: the twins stay, and
                // the watcher loads the directory when it can be read.
                manifests::failed(&metrics, &catalog, &e);
                false
            }
        };
        drop(src);
        tasks.spawn(manifests::watch(
            dir,
            config.node_name.clone(),
            Duration::from_millis(config.manifests.poll_interval_ms),
            sources.clone(),
            sync.clone(),
            metrics.clone(),
            loaded,
            seen,
            cancel.clone(),
        ));
    }

    if config.modules.dmi {
        let path = config.dmi_socket();
        let group = config
            .dmi
            .socket_group
            .as_deref()
            .and_then(rt::host::group_id);
        let listener = dmi::bind(&path, group)?;
        let m = dmi::mappers::start(
            twin.clone(),
            catalog.clone(),
            sync.subscribe(),
            metrics.clone(),
            config.dmi.liveness(),
            cancel.clone(),
        )
        .await;
        let server = dmi::DmiServer {
            twin: twin.clone(),
            mappers: m.clone(),
            metrics: metrics.clone(),
        };
        tasks.spawn(dmi::serve(
            listener,
            path,
            config.dmi.max_connections,
            server,
            cancel.clone(),
        ));
        let _ = mappers.set(m);
    }

    tasks.spawn(
        alarms
            .clone()
            .run(catalog.clone(), alarm_changes, alarm_events, cancel.clone()),
    );
    started.store(true, std::sync::atomic::Ordering::Release);
    // The start's burst (a first start writes every twin) filled the databases' page caches.
    twin.store().release_cache().await;
    rt::sys::release_freed();
    // Its journal too, folded into the tables in the background within seconds, fills them
    // again: folded now, beside what follows, and what that filled handed back as well.
    let store = twin.store().clone();
    let twin2 = twin.clone();
    tasks.spawn(async move {
        if store.unfolded() > 0 {
            if let Err(e) = store.fold().await {
                tracing::debug!(error = %e, "the start's journal is left to the background fold");
            }
            store.release_cache().await;
            // The twins it created lie among the burst's freed allocations: made again
            // now, they pack together and the holes go back to the system.
            let began = std::time::Instant::now();
            match twin2.repack().await {
                Ok(Ok(())) => tracing::debug!(
                    ms = began.elapsed().as_millis() as u64,
                    "the twins made again after the start"
                ),
                Ok(Err(e)) => tracing::warn!(error = %e, "the twins were left as made"),
                Err(e) => tracing::debug!(error = %e, "the twins were left as made"),
            }
            rt::sys::release_freed();
        }
    });
    if let Some(cloud) = &config.cloud {
        // The container runtime, for the cloud's exec and attach, and the pods' usage.
        let runtime = config.edged.as_ref().map(|e| {
            std::sync::Arc::new(edged::Runtime::new(
                &e.runtime_endpoint,
                Duration::from_millis(e.runtime_timeout_ms),
            ))
        });
        let jobs = Arc::new(crate::edgehub::jobs::Jobs::new(
            config.data_dir.clone(),
            relaunch.clone(),
            cancel.clone(),
            runtime.clone(),
        ));
        let hub = crate::edgehub::EdgeHub {
            cloud: cloud.clone(),
            node: config.node_name.clone(),
            node_labels: config.node_labels.clone(),
            data_dir: config.data_dir.clone(),
            twin: twin.clone(),
            sources: sources.clone(),
            catalog: catalog.clone(),
            sync: sync.clone(),
            meta: meta.clone(),
            pods: config.edged.is_some().then(|| cloud_pods.clone()),
            metrics: metrics.clone(),
            runtime: runtime.clone(),
            jobs: jobs.clone(),
            alarms: alarms.clone(),
            link: std::sync::Mutex::new(None),
            tunnel: cloud.streams.enable.then(|| {
                std::sync::Arc::new(crate::edgehub::tunnel::Services {
                    node: config.node_name.clone(),
                    log_root: config.edged.as_ref().and_then(|e| e.pod_log_dir.clone()),
                    pods: edged_pods.clone(),
                    runtime: runtime.clone(),
                    limits: cloud.streams.clone(),
                    metrics: metrics.clone(),
                })
            }),
        };
        tasks.spawn(hub.run(cancel.clone()));
        if let Some(seconds) = trial {
            tokio::spawn(jobs.trial(seconds));
        }
    }

    tracing::info!("edgecore running");
    cancel.cancelled().await;
    tracing::info!("edgecore stopping");
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        tracing::warn!("modules did not stop within 10 s");
    }
    twin.store().close().await;
    tracing::info!("edgecore stopped");
    Ok(())
}
