//! Kafka share groups on this shard's engines: acknowledge, then acquire (ShareFetch and
//! ShareAcknowledge), release, and the share-group offset APIs.

use super::ops::QueueFailure;
use super::ops::SharePart;
use super::ops::SharePartResult;
use super::ops::ShareSettings;
use super::ops::StartAt;
use super::read::read_range;
use super::read::wait_high_watermark;
use super::state_log::state_log_dir_name;
use super::QueueHost;
use super::{replicated, storage_failure, Engine, StateStore};
use crate::queue::engine::ConsumerId;
use crate::queue::engine::QueueError;
use crate::queue::engine::Reply;
use crate::queue::engine::SettleItem;
use crate::shard::ops::PartRef;
use futures::channel::oneshot;
use std::rc::Rc;
use strand_protocol::types::Offset;

impl QueueHost {
    /// The engine of a share group's partition, configured with the group's settings.
    pub(super) async fn share_engine(
        &self,
        part: &PartRef,
        group: &str,
        settings: &ShareSettings,
    ) -> Result<Rc<Engine>, QueueFailure> {
        let shard = &self.core;
        let engine = self
            .engine_from(&part.topic, part.partition, group, settings.auto_offset_reset)
            .await?;
        if engine.share.borrow().as_ref() != Some(settings) {
            let log = shard
                .topic_settings(&part.topic)
                .ok_or_else(|| QueueFailure::UnknownQueue(part.topic.clone()))?;
            engine
                .q
                .borrow_mut()
                .reconfigure(settings.engine_config(&log))
                .map_err(|e| QueueFailure::Invalid(e.to_string()))?;
            *engine.share.borrow_mut() = Some(settings.clone());
        }
        Ok(engine)
    }

    /// ShareFetch / ShareAcknowledge on this shard's partitions: acknowledgements first, then
    /// acquisition (for parts with `fetch`), at most `max_records` records over all parts.
    pub(super) async fn share(
        &self,
        group: &str,
        member: &str,
        settings: &ShareSettings,
        parts: Vec<SharePart>,
        max_records: u32,
    ) -> Vec<SharePartResult> {
        let shard = &self.core;
        let owner = ConsumerId::new(member);
        let mut out = vec![SharePartResult::default(); parts.len()];
        let mut engines = Vec::with_capacity(parts.len());
        for (i, p) in parts.iter().enumerate() {
            match self.share_engine(&p.part, group, settings).await {
                Ok(e) => engines.push(Some(e)),
                Err(e) => {
                    if let Some(r) = out.get_mut(i) {
                        r.error = Some(e);
                    }
                    engines.push(None);
                }
            }
        }
        // Acknowledgements.
        for (i, (p, engine)) in parts.iter().zip(&engines).enumerate() {
            let Some(engine) = engine else { continue };
            if p.settle.is_empty() {
                continue;
            }
            let refused = self.share_settle(engine, &p.settle).await;
            if let Some(r) = out.get_mut(i) {
                r.ack_error = refused;
            }
        }
        // Acquisition.
        let mut left = max_records.max(1);
        for (i, (p, engine)) in parts.iter().zip(&engines).enumerate() {
            let Some(engine) = engine else { continue };
            if !p.fetch || left == 0 {
                continue;
            }
            self.refresh(engine).await;
            let want = left.min(engine.q.borrow().config().max_lease_batch);
            let request = engine.request_id();
            let (tx, rx) = oneshot::channel();
            engine.waiters.borrow_mut().insert(request, tx);
            let started = engine.q.borrow_mut().lease(
                request,
                &owner,
                want,
                settings.record_lock_duration_ms,
                shard.now_ms(),
            );
            if let Err(e) = started {
                engine.waiters.borrow_mut().remove(&request);
                self.drain(engine);
                // Lock limits mean "nothing more for you now", not an error.
                if !matches!(
                    e,
                    QueueError::ConsumerLeaseLimit { .. } | QueueError::PartitionLeaseLimit { .. }
                ) {
                    if let Some(r) = out.get_mut(i) {
                        r.error = Some(e.into());
                    }
                }
                continue;
            }
            self.drain(engine);
            let leases = match rx.await {
                Ok(Ok(Reply::Leases(l))) => l,
                Ok(Ok(_)) => Vec::new(),
                Ok(Err(e)) => {
                    if let Some(r) = out.get_mut(i) {
                        r.error = Some(e.into());
                    }
                    continue;
                }
                Err(_) => continue,
            };
            if leases.is_empty() {
                continue;
            }
            left = left.saturating_sub(leases.len() as u32);
            let mut leases = leases;
            leases.sort_by_key(|l| l.offset);
            let first = leases.first().map_or(0, |l| l.offset.0);
            let last = leases.last().map_or(0, |l| l.offset.0);
            wait_high_watermark(shard, engine.log, last + 1).await;
            let records = read_range(shard, engine.log, first, last, p.max_bytes).await;
            if let Some(r) = out.get_mut(i) {
                r.acquired = crate::queue::engine::Lease::acquired_ranges(&leases)
                    .into_iter()
                    .map(|(a, b, n)| (a.0, b.0, i16::try_from(n).unwrap_or(i16::MAX)))
                    .collect();
                r.records = records;
            }
        }
        out
    }

    /// Settles share acknowledgements; the first refusal, if any (the others go through).
    pub(super) async fn share_settle(
        &self,
        engine: &Rc<Engine>,
        items: &[SettleItem],
    ) -> Option<QueueFailure> {
        let shard = &self.core;
        let max = engine.q.borrow().config().max_lease_batch.max(1) as usize;
        let mut refused = None;
        for chunk in items.chunks(max) {
            let request = engine.request_id();
            let (tx, rx) = oneshot::channel();
            engine.waiters.borrow_mut().insert(request, tx);
            let started = engine.q.borrow_mut().settle(request, chunk, shard.now_ms());
            if let Err(e) = started {
                engine.waiters.borrow_mut().remove(&request);
                self.drain(engine);
                return Some(e.into());
            }
            self.drain(engine);
            match rx.await {
                Ok(Ok(Reply::Settled(results))) => {
                    if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
                        refused.get_or_insert(e.into());
                    }
                }
                Ok(Err(e)) => return Some(e.into()),
                _ => {
                    return Some(QueueFailure::Unavailable(
                        "the queue engine did not answer".into(),
                    ))
                }
            }
        }
        refused
    }

    /// Releases what `member` holds in these partitions: the records are available again at
    /// once (a closed session, forgotten partitions).
    pub(super) fn share_release(&self, group: &str, member: &str, parts: &[PartRef]) {
        let shard = &self.core;
        let engines: Vec<Rc<Engine>> = self
            .engines
            .borrow()
            .values()
            .filter(|e| {
                e.key.group == group
                    && parts
                        .iter()
                        .any(|p| p.topic == e.key.topic && p.partition == e.key.partition)
            })
            .cloned()
            .collect();
        let owner = ConsumerId::new(member);
        for e in engines {
            let n = e.q.borrow_mut().release_owner(&owner, shard.now_ms());
            if n > 0 {
                tracing::debug!(group, member, released = n, topic = %e.key.topic, partition = e.key.partition, "released share records");
            }
            self.drain(&e);
        }
        self.changed.notify_all();
    }

    /// The share-partition start offsets of `group`'s engines on this shard (of `topics` only,
    /// if named), sorted by topic and partition.
    pub(super) fn share_offsets(&self, group: &str, topics: Option<&[String]>) -> Vec<(String, i32, i64)> {
        let mut out: Vec<(String, i32, i64)> = self
            .engines
            .borrow()
            .values()
            .filter(|e| e.key.group == group && topics.is_none_or(|ts| ts.contains(&e.key.topic)))
            .map(|e| (e.key.topic.clone(), e.key.partition, e.q.borrow().start().0))
            .collect();
        out.sort();
        out
    }

    /// Removes `group`'s engines of `topics` on this shard and their state logs (the caller
    /// checked that the share group has no members). A directory left by an engine that did
    /// not open goes too.
    pub(super) async fn share_delete_state(&self, group: &str, topics: &[String]) {
        let shard = &self.core;
        let engines: Vec<Rc<Engine>> = self
            .engines
            .borrow()
            .values()
            .filter(|e| e.key.group == group && topics.contains(&e.key.topic))
            .cloned()
            .collect();
        for e in engines {
            self.close(&e);
            if let StateStore::Log(state_log) = e.state {
                if let Err(err) = shard.store.remove_log(state_log).await {
                    tracing::warn!(topic = %e.key.topic, partition = e.key.partition, group, error = %err, "cannot remove a share group's state log");
                }
            }
        }
        if !shard.config.cluster.is_standalone() {
            self.share_forget_replicated(group, topics).await;
        }
        let md = shard.metadata();
        for topic in topics {
            let Some(t) = md.topic(topic) else { continue };
            for p in 0..t.partitions {
                if shard.owner(topic, p) != shard.id {
                    continue;
                }
                let Ok(name) = state_log_dir_name(topic, p, group) else {
                    continue;
                };
                let dir = shard.config.log_dir.join(name);
                if dir.exists() {
                    if let Err(err) = std::fs::remove_dir_all(&dir) {
                        tracing::warn!(dir = %dir.display(), error = %err, "cannot remove queue state");
                    }
                }
            }
        }
        tracing::info!(group, ?topics, "share group offsets deleted");
    }

    /// On a cluster node, `group`'s state on the partitions of `topics` this shard leads is
    /// forgotten through each partition's group (a `FORGET` side record); partitions led
    /// elsewhere are left as they are (DeleteShareGroupOffsets reaches their leaders' shards
    /// as it reaches this one).
    async fn share_forget_replicated(&self, group: &str, topics: &[String]) {
        let shard = &self.core;
        let md = shard.metadata();
        for topic in topics {
            let Some(t) = md.topic(topic) else { continue };
            for p in 0..t.partitions {
                if self.serves(topic, p).ok().flatten().is_none() {
                    continue;
                }
                let keep_from = self
                    .sides
                    .borrow()
                    .get(&(topic.clone(), p))
                    .map_or(0, replicated::PartitionSide::keep_from);
                // A write of no records is one part.
                let Some(data) = replicated::encode(group, false, true, &[]).pop() else {
                    continue;
                };
                match shard.propose_side(topic, p, keep_from, data).await {
                    Ok(index) => {
                        if let Some(part) = self.sides.borrow_mut().get_mut(&(topic.clone(), p)) {
                            part.committed(group, index, false, true);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(topic, partition = p, group, error = ?e, "cannot forget a share group's replicated state");
                    }
                }
            }
        }
    }

    /// Starts `group`'s share state of (topic, partition) over at `start_offset` (raised to the
    /// log start offset) and waits until that is durable. The caller checked that the share
    /// group has no members; leases still held go with the old state (as in Kafka).
    pub(super) async fn share_alter(
        &self,
        group: &str,
        topic: &str,
        partition: i32,
        start_offset: i64,
    ) -> Result<(), QueueFailure> {
        let shard = &self.core;
        let engine = self
            .engine_from(topic, partition, group, StartAt::Earliest)
            .await?;
        let log_start = shard
            .store
            .offsets(engine.log)
            .map(|o| o.log_start_offset)
            .map_err(storage_failure)?;
        let start = start_offset.max(log_start);
        engine
            .q
            .borrow_mut()
            .reset_discarding_leases(Offset(start), shard.now_ms())?;
        self.drain(&engine);
        let durable = match engine.state {
            StateStore::Log(state_log) => {
                let written = shard
                    .store
                    .offsets(state_log)
                    .map(|o| o.log_end_offset)
                    .map_err(storage_failure)?;
                wait_high_watermark(shard, state_log, written).await;
                shard
                    .store
                    .offsets(state_log)
                    .is_ok_and(|o| o.high_watermark >= written)
            }
            StateStore::Replicated => {
                // Every write issued so far (the reset's among them) committed, or the engine
                // closed on a failed one.
                while engine.writing.get() > 0 && !engine.closed.get() {
                    engine.written.wait().await;
                }
                !engine.closed.get()
            }
        };
        if !durable {
            return Err(QueueFailure::Storage(
                "the new start offset could not be made durable".into(),
            ));
        }
        self.kick_load(&engine);
        self.changed.notify_all();
        tracing::info!(group, topic, partition, start, "share group start offset altered");
        Ok(())
    }
}
