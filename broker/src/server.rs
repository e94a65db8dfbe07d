//! Start-up, the shard executors, and shutdown.
//!
//! Start-up order: lock the log directory, check `meta.properties`, load the metadata, replay any
//! shard journals left by a crash (one thread, before any shard runs), remove logs of deleted
//! topics, start the admin listener, start one pinned glommio executor per shard. Each shard
//! opens its store and partitions and binds every Kafka listener (SO_REUSEPORT: the kernel spreads
//! connections over the shards); once all shards are ready, the ready file is written and shards
//! start accepting. SIGTERM/SIGINT: shards stop accepting, flush, checkpoint and exit, so the next
//! start needs no recovery.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use glommio::{LocalExecutorBuilder, Placement};
use strand_protocol::types::ShardId;
use strand_storage::fs::{block_on, StdFs};
use strand_storage::fs_glommio::{self, GlommioFs, GlommioFsConfig, SharedFs};
use strand_storage::{replay_journals, FileRegions, LogConfig, LogKey, ShardStore, StoreConfig};

use crate::clock::{Clock, SystemClock};
use crate::cluster_link::{self, ClusterLink};
use crate::config::Config;
use crate::connection::{self, Connections};
use crate::controller::METADATA_FILE;
use crate::metadata::{ClusterMetadata, MetadataDelta};
use crate::metrics;
use crate::shard::router::{self, serve_peer, Router};
use crate::shard::{tasks, AdvertisedListener, Shard};
use crate::subsystems::Subsystems;

/// Options that are not Kafka configuration.
#[derive(Debug, Default, Clone)]
pub struct ServerOptions {
    /// Where to write the JSON ready file once every listener is bound and data recovered.
    pub ready_file: Option<PathBuf>,
}

/// Messages per cross-shard channel.
const MESH_CHANNEL_CAPACITY: usize = 1024;
struct Ready {
    shard: u16,
    problems: Vec<String>,
}

/// Runs the broker until SIGTERM/SIGINT.
pub fn run(mut config: Config, options: ServerOptions) -> anyhow::Result<()> {
    let started = Instant::now();
    std::fs::create_dir_all(&config.log_dir)
        .with_context(|| format!("cannot create log directory {}", config.log_dir.display()))?;
    // Absolute from here on: glommio's directory operations do not resolve relative paths.
    config.log_dir = std::fs::canonicalize(&config.log_dir)
        .with_context(|| format!("cannot resolve log directory {}", config.log_dir.display()))?;
    let log_dir = config.log_dir.clone();
    let lock_path = log_dir.join(".lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("cannot open {}", lock_path.display()))?;
    if lock.try_lock().is_err() {
        bail!(
            "log directory {} is in use by another process (lock file {})",
            log_dir.display(),
            lock_path.display()
        );
    }
    check_meta_properties(&log_dir, &config)?;

    let metadata = if config.cluster.is_standalone() {
        ensure_internal_topics(&log_dir, load_metadata(&log_dir)?, &config)?
    } else {
        drop_node_local_offsets_topic(&log_dir, load_metadata(&log_dir)?)?
    };
    if metadata.partition_count() > u64::from(config.max_partitions) {
        tracing::warn!(
            partitions = metadata.partition_count(),
            limit = config.max_partitions,
            "the node holds more partitions than strand.max.partitions: new ones are refused until topics are deleted"
        );
    }
    // Groups map to the partitions of __consumer_offsets as it exists, whatever the setting says now.
    config.offsets_topic_num_partitions =
        crate::group::host::offsets_partitions_in_use(&metadata, config.offsets_topic_num_partitions);
    let clock = SystemClock;
    // Crash recovery of acknowledged-but-unflushed batches, before anything else reads the logs.
    let report = block_on(replay_journals(
        &StdFs,
        &log_dir,
        |key| log_config_for(&metadata, &config, key),
        clock.now_ms(),
    ))
    .context("journal replay failed")?;
    if report.files > 0 {
        tracing::info!(
            files = report.files,
            applied = report.entries_applied,
            present = report.entries_present,
            orphaned = report.entries_orphaned,
            logs = report.logs_touched,
            "replayed shard journals"
        );
    }
    if config.cluster.is_standalone() {
        remove_stray_logs(&log_dir, &metadata);
    }

    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(metrics::LATENCY_BUCKETS_SECONDS)
        .context("metrics buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    metrics::describe();
    let ready_flag = Arc::new(AtomicBool::new(false));
    let admin_addr = crate::admin::start(&config.admin_listener.to_string(), prometheus, ready_flag.clone())
        .with_context(|| format!("cannot bind the admin listener {}", config.admin_listener))?;

    let shards = config.shards.clamp(1, usize::from(u16::MAX));
    // What the shards' file systems share: the bound on file regions alive at once (taken from
    // the open-files limit main has raised), and what the data directory's file system turns
    // out not to support.
    let shared_fs = SharedFs::for_process(FileRegions::for_process(FileRegions::open_files_share()));
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let config = Arc::new(config);
    let shutdown = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel::<Ready>();
    let (bound_tx, bound_rx) = mpsc::channel::<Result<Vec<SocketAddr>, String>>();
    let mut ports_txs = Vec::new();
    let mut handles = Vec::new();
    let mut chans = router::mesh(shards, MESH_CHANNEL_CAPACITY).into_iter();
    for i in 0..shards {
        let chan = chans.next().context("mesh")?;
        let (ports_tx, ports_rx) = mpsc::channel::<Vec<SocketAddr>>();
        ports_txs.push(ports_tx);
        let config = config.clone();
        let metadata = metadata.clone();
        let shutdown = shutdown.clone();
        let go = go.clone();
        let ready_tx = ready_tx.clone();
        let bound_tx = bound_tx.clone();
        let handle = LocalExecutorBuilder::new(Placement::Fixed(i % cpus))
            .name(&format!("strand-shard-{i}"))
            .io_memory(1 << 20)
            .spawn(move || async move {
                let id = ShardId(i as u16);
                if let Err(e) = shard_main(
                    id,
                    shards as u16,
                    config,
                    metadata,
                    chan,
                    shutdown,
                    go,
                    ready_tx,
                    bound_tx,
                    ports_rx,
                    shared_fs,
                )
                .await
                {
                    tracing::error!(shard = i, error = %format!("{e:#}"), "shard failed");
                    std::process::exit(1);
                }
            })
            .map_err(std::io::Error::from)
            .with_context(|| format!("cannot start shard {i}"))?;
        handles.push(handle);
    }
    drop(ready_tx);
    drop(bound_tx);

    // Shard 0 binds first (resolving port 0); the others bind the same ports (SO_REUSEPORT).
    let bound = match bound_rx.recv() {
        Ok(Ok(addrs)) => addrs,
        Ok(Err(e)) => bail!("{e}"),
        Err(_) => bail!("shard 0 stopped before binding its listeners"),
    };
    for tx in ports_txs.iter().skip(1) {
        let _ = tx.send(bound.clone());
    }
    let mut problems = Vec::new();
    for _ in 0..shards {
        match ready_rx.recv() {
            Ok(r) => {
                for p in &r.problems {
                    tracing::error!(shard = r.shard, problem = %p, "start-up problem");
                }
                problems.extend(r.problems);
            }
            Err(_) => bail!("a shard stopped during start-up"),
        }
    }
    let http_addr = *bound.last().context("the HTTP listener address")?;
    let listeners: Vec<(String, SocketAddr)> = config
        .listeners
        .iter()
        .map(|l| l.name.clone())
        .zip(bound.iter().copied())
        .collect();
    if let Some(path) = &options.ready_file {
        write_ready_file(path, &listeners, http_addr, admin_addr)?;
    }
    go.store(true, Ordering::Release);
    ready_flag.store(true, Ordering::Release);
    tracing::info!(
        shards,
        topics = metadata.topic_count(),
        listeners = ?listeners,
        http = %http_addr,
        admin = %admin_addr,
        startup_ms = started.elapsed().as_millis() as u64,
        "strand is ready"
    );

    let term = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, term.clone()).context("SIGTERM handler")?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, term.clone()).context("SIGINT handler")?;
    while !term.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(50));
    }
    tracing::info!("shutting down");
    shutdown.store(true, Ordering::Release);
    for h in handles {
        let _ = h.join();
    }
    tracing::info!("stopped cleanly");
    drop(lock);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn shard_main(
    id: ShardId,
    shards: u16,
    config: Arc<Config>,
    metadata: ClusterMetadata,
    chan: router::ShardChannels,
    shutdown: Arc<AtomicBool>,
    go: Arc<AtomicBool>,
    ready_tx: mpsc::Sender<Ready>,
    bound_tx: mpsc::Sender<Result<Vec<SocketAddr>, String>>,
    ports_rx: mpsc::Receiver<Vec<SocketAddr>>,
    shared_fs: &'static SharedFs,
) -> anyhow::Result<()> {
    let config = Rc::new((*config).clone());
    let page_cache_guard_bytes = fs_glommio::page_cache_guard_bytes(&config.log_dir);
    if id.0 == 0 && config.log_direct_writes {
        tracing::info!(
            page_cache_guard_bytes,
            "segments are written directly; reads this far behind a segment's end go through the page cache"
        );
    }
    let fs = GlommioFs::new(
        GlommioFsConfig {
            direct_segment_writes: config.log_direct_writes,
            recent_writes_bytes: config.log_direct_cache_bytes,
            page_cache_guard_bytes,
            drop_behind_bytes: config.log_drop_behind_bytes,
        },
        shared_fs,
    );
    let (router, peers) = Router::connect(chan).await;
    let router = Rc::new(router);
    let store = ShardStore::open(
        fs,
        config.log_dir.clone(),
        id.0,
        StoreConfig {
            journal_segment_bytes: config.journal_segment_bytes,
            journal_recycle_files: config.journal_recycle_files,
            direct_min_log_bytes: config.journal_direct_min_log_bytes,
            resume_free_bytes: config.storage_resume_free_bytes,
            ..StoreConfig::default()
        },
    )
    .await
    .context("cannot open the shard store")?;

    // Listeners: shard 0 resolves ephemeral ports for everyone.
    let mut sockets = Vec::new();
    if id.0 == 0 {
        let mut addrs = Vec::new();
        for l in &config.listeners {
            let addr = l.bind.to_string();
            match glommio::net::TcpListener::bind(addr.as_str()) {
                Ok(s) => {
                    addrs.push(
                        s.local_addr()
                            .map_err(std::io::Error::from)
                            .context("listener address")?,
                    );
                    sockets.push(s);
                }
                Err(e) => {
                    let msg = format!("cannot bind listener {} on {addr}: {e}", l.name);
                    let _ = bound_tx.send(Err(msg.clone()));
                    bail!(msg);
                }
            }
        }
        // The HTTP queue API, last.
        let http = config.http_listener.to_string();
        match glommio::net::TcpListener::bind(http.as_str()) {
            Ok(s) => {
                addrs.push(
                    s.local_addr()
                        .map_err(std::io::Error::from)
                        .context("http listener address")?,
                );
                sockets.push(s);
            }
            Err(e) => {
                let msg = format!("cannot bind strand.http.listener on {http}: {e}");
                let _ = bound_tx.send(Err(msg.clone()));
                bail!(msg);
            }
        }
        let _ = bound_tx.send(Ok(addrs));
    } else {
        let addrs = ports_rx.recv().context("waiting for listener ports")?;
        for a in addrs {
            sockets.push(
                glommio::net::TcpListener::bind(a)
                    .map_err(std::io::Error::from)
                    .with_context(|| format!("cannot bind {a}"))?,
            );
        }
    }
    let http_socket = sockets.pop().context("the HTTP listener")?;
    let bound: Vec<SocketAddr> = sockets.iter().filter_map(|s| s.local_addr().ok()).collect();
    let advertised: Vec<AdvertisedListener> = config
        .listeners
        .iter()
        .zip(&bound)
        .map(|(l, b)| AdvertisedListener {
            host: l.advertised.host.clone(),
            port: if l.advertised.port == 0 {
                b.port()
            } else {
                l.advertised.port
            },
        })
        .collect();

    let shard = Rc::new(Shard::new(
        id,
        shards,
        config.clone(),
        Rc::new(SystemClock),
        Rc::new(store),
        metadata.clone(),
        router.clone(),
        Rc::new(advertised),
    ));
    let subsystems = Subsystems::new(&shard, metadata, config.log_dir.clone());
    let connections = Rc::new(Connections::new(subsystems.clone()));
    shard.serve(&connections);
    for (peer, rx) in peers {
        let s = shard.clone();
        glommio::spawn_local(serve_peer(router.clone(), peer, rx, move |req| s.start(req))).detach();
    }
    let problems = shard.open_all().await;
    subsystems.start().await;
    // A KRaft-configured node: the link between its shards and its cluster part (shard 0).
    let _cluster = (!config.cluster.is_standalone()).then(|| {
        let link = ClusterLink::new(&shard);
        if let Some(r) = &subsystems.replication {
            r.manager
                .set_reports(Rc::new(cluster_link::ElectionReports(Rc::downgrade(&shard))));
        }
        let node = (id.0 == 0).then(|| cluster_link::start(&shard, &link));
        (link, node)
    });
    shard.update_partition_gauges();
    glommio::spawn_local(tasks::flusher(shard.clone())).detach();
    glommio::spawn_local(tasks::stall_probe(shard.clone())).detach();
    glommio::spawn_local(tasks::housekeeping(shard.clone())).detach();
    let _ = ready_tx.send(Ready {
        shard: id.0,
        problems,
    });
    while !go.load(Ordering::Acquire) {
        if shutdown.load(Ordering::Acquire) {
            return Ok(());
        }
        glommio::timer::sleep(Duration::from_millis(2)).await;
    }

    let mut accepts = Vec::new();
    for (i, socket) in sockets.into_iter().enumerate() {
        let connections = connections.clone();
        accepts.push(glommio::spawn_local(async move {
            loop {
                match socket.accept().await {
                    Ok(stream) => {
                        glommio::spawn_local(connection::accepted(connections.clone(), stream, i)).detach();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        glommio::timer::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }));
    }

    accepts.push(glommio::spawn_local(crate::queue::doors::http::accept(
        shard.clone(),
        connections.request_memory(),
        http_socket,
    )));

    while !shutdown.load(Ordering::Acquire) {
        glommio::timer::sleep(Duration::from_millis(50)).await;
    }
    // The partition groups this node leads hand their leadership to their followers furthest
    // along and stop, before the controlled shutdown (which then finds nothing left to move)
    // and before their logs close.
    if let Some(r) = &subsystems.replication {
        let moves = r.manager.shut_down().await;
        tracing::info!(
            led = moves.led,
            moved = moves.moved,
            "partition leaderships handed over"
        );
        shard.leaderships_handed_over.set(true);
    }
    if let Some((_, Some(node))) = &_cluster {
        node.shutdown(Duration::from_secs(10)).await;
    }
    shard.shutting_down.set(true);
    drop(accepts);
    connections.close();
    // Let in-flight produce requests reach the journal, then flush and checkpoint everything.
    glommio::timer::sleep(Duration::from_millis(20)).await;
    let closing = Instant::now();
    match shard.store.shutdown().await {
        Ok(stats) => tracing::info!(
            shard = id.0,
            logs_checkpointed = stats.logs,
            syncfs = stats.syncfs,
            checkpoint_ms = stats.duration_us / 1000,
            store_close_ms = closing.elapsed().as_millis() as u64,
            "shard store closed"
        ),
        Err(e) => {
            tracing::error!(shard = id.0, error = %e, "clean shutdown failed; the next start will recover")
        }
    }
    Ok(())
}

/// The storage configuration of a log found in a journal, if it still belongs to a live topic.
fn log_config_for(md: &ClusterMetadata, config: &Config, key: &LogKey) -> Option<LogConfig> {
    if *key == crate::cluster::node::metadata_log_key() {
        return Some(crate::cluster::node::metadata_log_config());
    }
    if let Some((topic, partition)) = crate::internal_topics::parse_side_log_dir_name(&key.dir_name) {
        // Side logs exist only on cluster nodes, whose topics the controller quorum names.
        let known = md
            .topic(topic)
            .is_none_or(|t| *t.id.0.as_bytes() == key.incarnation && partition < t.partitions);
        return (!config.cluster.is_standalone() && known).then(crate::internal_topics::side_log_config);
    }
    if let Some((topic, partition, _)) = crate::queue::host::parse_state_log_dir_name(&key.dir_name) {
        let t = md.topic(topic)?;
        let live = *t.id.0.as_bytes() == key.incarnation && partition < t.partitions;
        return live.then(crate::queue::host::state_log_config);
    }
    let (topic, partition) = parse_dir_name(&key.dir_name)?;
    let Some(t) = md.topic(topic) else {
        // On a cluster node the topics come from the controller quorum, learnt after start-up:
        // a log of a topic this node does not know yet is replayed with the broker's defaults.
        return (!config.cluster.is_standalone())
            .then(|| Shard::log_config(&crate::config::TopicConfig::default().log_settings(config)));
    };
    if *t.id.0.as_bytes() != key.incarnation || partition >= t.partitions {
        return None;
    }
    Some(Shard::log_config(&t.config.log_settings(config)))
}

/// `orders-12` -> ("orders", 12).
fn parse_dir_name(name: &str) -> Option<(&str, i32)> {
    let (topic, p) = name.rsplit_once('-')?;
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    strand_protocol::types::validate_topic_name(topic).ok()?;
    Some((topic, p.parse().ok()?))
}

/// Deletes partition directories that no topic owns any more (a crash between a topic deletion
/// and the removal of its logs), and half-deleted `*-delete` directories.
fn remove_stray_logs(log_dir: &Path, md: &ClusterMetadata) {
    let Ok(entries) = std::fs::read_dir(log_dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if !path.is_dir() {
            continue;
        }
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        if name.ends_with("-delete") {
            let _ = std::fs::remove_dir_all(&path);
            continue;
        }
        if name == crate::cluster::node::METADATA_DIR {
            // The controller quorum's log: no topic of the node's own metadata owns it.
            continue;
        }
        let Some((topic, partition)) = parse_dir_name(&name) else {
            continue;
        };
        let live = md.topic(topic).is_some_and(|t| {
            partition < t.partitions
                && std::fs::read_to_string(path.join("partition.metadata"))
                    .map(|m| m.contains(&strand_storage::store::base64_url(t.id.0.as_bytes())))
                    .unwrap_or(true)
        });
        if !live {
            tracing::warn!(dir = %path.display(), "removing the log of a deleted topic");
            let _ = std::fs::remove_dir_all(&path);
        }
    }
    // Queue state of deleted topics (or partitions); group directories of a re-created topic
    // are recognised by their incarnation when opened.
    crate::queue::host::remove_state_dirs(log_dir, |topic, partition| {
        md.topic(topic).is_none_or(|t| partition >= t.partitions)
    });
}

/// Creates `__consumer_offsets` (compacted, `offsets.topic.num.partitions` partitions) the
/// first time the broker starts, before any shard opens its logs.
fn ensure_internal_topics(
    log_dir: &Path,
    mut md: ClusterMetadata,
    config: &Config,
) -> anyhow::Result<ClusterMetadata> {
    use crate::group::host::OFFSETS_TOPIC;
    if md.topic(OFFSETS_TOPIC).is_some() {
        return Ok(md);
    }
    let topic = crate::metadata::NewTopic {
        name: OFFSETS_TOPIC.to_owned(),
        num_partitions: i32::try_from(config.offsets_topic_num_partitions).unwrap_or(50),
        replication_factor: -1,
        assignments: vec![],
        configs: vec![
            ("cleanup.policy".into(), Some("compact".into())),
            ("segment.bytes".into(), Some("104857600".into())),
        ],
    };
    let id = strand_protocol::types::TopicId(uuid::Uuid::new_v4());
    let delta = md
        .plan_create(&topic, 1, config.node_id.0, id)
        .map_err(|e| anyhow::anyhow!("cannot create {OFFSETS_TOPIC}: {}", e.message))?;
    md.apply(&delta);
    write_metadata(log_dir, &md)?;
    tracing::info!(partitions = topic.num_partitions, "created {OFFSETS_TOPIC}");
    Ok(md)
}

/// A cluster node's `__consumer_offsets` is the cluster's (replicated, created by the cluster at
/// the first FindCoordinator): one this node created for itself (an earlier version did, on
/// cluster nodes too) holds offsets committed to this node alone and would keep the cluster's
/// topic from being served here, so it goes, with its logs.
fn drop_node_local_offsets_topic(log_dir: &Path, mut md: ClusterMetadata) -> anyhow::Result<ClusterMetadata> {
    use crate::group::host::OFFSETS_TOPIC;
    let Some(local) = md.topic(OFFSETS_TOPIC).map(|t| (t.id, t.partitions)) else {
        return Ok(md);
    };
    tracing::warn!(
        "removing this node's own {OFFSETS_TOPIC}: on a cluster node the topic is the cluster's, \
         replicated; the offsets committed to this node alone are dropped"
    );
    md.apply(&MetadataDelta::DeleteTopic {
        name: OFFSETS_TOPIC.to_owned(),
        id: local.0,
    });
    write_metadata(log_dir, &md)?;
    for p in 0..local.1 {
        let dir = log_dir.join(format!("{OFFSETS_TOPIC}-{p}"));
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(e).with_context(|| format!("cannot remove {}", dir.display()));
            }
        }
    }
    Ok(md)
}

/// Writes the node's own metadata (`strand-metadata.json`) at start-up, atomically.
fn write_metadata(log_dir: &Path, md: &ClusterMetadata) -> anyhow::Result<()> {
    let path = log_dir.join(METADATA_FILE);
    block_on(strand_storage::fs::Fs::write_file_atomic(
        &StdFs,
        &path,
        md.to_json(),
    ))
    .with_context(|| format!("cannot write {}", path.display()))
}

fn load_metadata(log_dir: &Path) -> anyhow::Result<ClusterMetadata> {
    let path = log_dir.join(METADATA_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => ClusterMetadata::from_json(&bytes)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ClusterMetadata::default()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Kafka's `meta.properties`: the node id and cluster id a log directory belongs to. A mismatch
/// means the directory belongs to another broker or cluster, and start-up stops.
fn check_meta_properties(log_dir: &Path, config: &Config) -> anyhow::Result<()> {
    let path = log_dir.join("meta.properties");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("node.id=") {
                    if v.trim() != config.node_id.0.to_string() {
                        bail!(
                            "log directory {} belongs to node.id {}, but this broker is node.id {} ({})",
                            log_dir.display(),
                            v.trim(),
                            config.node_id.0,
                            path.display()
                        );
                    }
                }
                if let Some(v) = line.strip_prefix("cluster.id=") {
                    if v.trim() != config.cluster_id {
                        bail!(
                            "the cluster id {} does not match cluster.id {} stored in {}",
                            config.cluster_id,
                            v.trim(),
                            path.display()
                        );
                    }
                }
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let text = format!(
                "#Written by strand\nversion=1\nnode.id={}\ncluster.id={}\n",
                config.node_id.0, config.cluster_id
            );
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
            std::fs::File::open(&tmp).and_then(|f| f.sync_all()).ok();
            std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn write_ready_file(
    path: &Path,
    listeners: &[(String, SocketAddr)],
    http: SocketAddr,
    admin: SocketAddr,
) -> anyhow::Result<()> {
    let doc = serde_json::json!({
        "pid": std::process::id(),
        "kafka": listeners.iter().map(|(n, a)| serde_json::json!({"name": n, "addr": a.to_string()})).collect::<Vec<_>>(),
        "http": http.to_string(),
        "admin": admin.to_string(),
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&doc)?)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster node drops the `__consumer_offsets` an earlier version created for it alone,
    /// its logs and its entry in the metadata file, and keeps its other topics.
    #[test]
    fn a_cluster_node_drops_its_own_offsets_topic() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::default();
        let mut md = ensure_internal_topics(dir.path(), ClusterMetadata::default(), &config).unwrap();
        let other = crate::metadata::NewTopic {
            name: "orders".into(),
            num_partitions: 1,
            replication_factor: -1,
            assignments: vec![],
            configs: vec![],
        };
        let delta = md
            .plan_create(
                &other,
                1,
                1,
                strand_protocol::types::TopicId(uuid::Uuid::from_u128(9)),
            )
            .unwrap();
        md.apply(&delta);
        for name in ["__consumer_offsets-0", "__consumer_offsets-49", "orders-0"] {
            std::fs::create_dir_all(dir.path().join(name).join("x")).unwrap();
        }
        let kept = drop_node_local_offsets_topic(dir.path(), md).unwrap();
        assert!(kept.topic(crate::internal_topics::CONSUMER_OFFSETS).is_none());
        assert!(kept.topic("orders").is_some());
        assert!(!dir.path().join("__consumer_offsets-0").exists());
        assert!(!dir.path().join("__consumer_offsets-49").exists());
        assert!(dir.path().join("orders-0").exists());
        let stored = load_metadata(dir.path()).unwrap();
        assert_eq!(stored, kept, "the metadata file no longer holds it");
        // Nothing to drop the next time.
        assert_eq!(
            drop_node_local_offsets_topic(dir.path(), stored.clone()).unwrap(),
            stored
        );
    }

    #[test]
    fn dir_names() {
        assert_eq!(parse_dir_name("orders-12"), Some(("orders", 12)));
        assert_eq!(parse_dir_name("my-topic-0"), Some(("my-topic", 0)));
        assert_eq!(parse_dir_name("strand-journal"), None);
        assert_eq!(parse_dir_name("x-"), None);
    }
}
