//! The side log of a partition replica on a shard store: where its side records
//! ([`super::types::SideRecord`]) are stored, beside the partition log.
//!
//! - **Format.** A storage log of its own (its directory named by the broker), one record batch
//!   per side record, at the side log's own dense offsets: the batch's `partitionLeaderEpoch`
//!   is the entry's term, and its one record's value is the entry's Raft index and the record's
//!   keep-from index (8 bytes each, big-endian) followed by the record's data.
//! - **Opened lazily.** A replica without side records has no side log: it is created by the
//!   first append and found at a restart when its directory exists.
//! - **Durability** comes from the shard's flush rounds, as for the partition log: an append is
//!   staged, and the replica log's flush waits for its round.
//! - **Index.** The offset of every stored record by Raft index is kept in memory (the log is
//!   trimmed by its writer, so it stays small), for reads by index, truncations and trims.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io;
use std::rc::Rc;

use bytes::Bytes;
use strand_protocol::batch::build::{batch, TestRecord};
use strand_protocol::batch::BatchScanner;
use strand_protocol::records::decode_records;
use strand_protocol::types::LeaderEpoch;
use strand_storage::fs::Fs;
use strand_storage::log::LogConfig;
use strand_storage::store::{AppendTicket, LogId, ShardStore};
use strand_storage::{LogKey, StorageError};

use super::replica_log::StoredSide;
use super::types::SideRecord;
use crate::Term;

/// Bytes of the value prefix: the Raft index and the keep-from index.
const PREFIX_BYTES: usize = 16;
/// How much one read asks for; a larger batch still comes whole.
const READ_CHUNK_BYTES: usize = 1 << 20;
/// Decompression bound: side batches are written uncompressed; this only bounds a corrupt one.
const MAX_DECOMPRESSED_BYTES: usize = 64 << 20;

fn io_err(e: StorageError) -> io::Error {
    io::Error::other(e.to_string())
}

/// Where a replica's side log lives and how it is configured (the broker names it).
#[derive(Debug, Clone)]
pub struct SideLogSpec {
    pub key: LogKey,
    pub config: LogConfig,
}

/// A replica's side log (see the module documentation).
pub(super) struct SideLog<F: Fs> {
    store: Rc<ShardStore<F>>,
    spec: SideLogSpec,
    state: RefCell<SideLogState>,
}

#[derive(Default)]
struct SideLogState {
    id: Option<LogId>,
    /// Raft index → (side log offset, term) of every record stored.
    offsets: BTreeMap<u64, (i64, Term)>,
    /// Staged records not yet known durable, readable from here until they are.
    staged: BTreeMap<u64, StoredSide>,
    /// The highest index found at open (durable, as everything recovered is).
    recovered: u64,
}

impl<F: Fs> SideLog<F> {
    pub(super) fn new(store: Rc<ShardStore<F>>, spec: SideLogSpec) -> Self {
        SideLog {
            store,
            spec,
            state: RefCell::default(),
        }
    }

    /// Opens the side log if it exists (or `create`), reading its index.
    pub(super) async fn open(&self, create: bool, now_ms: i64) -> io::Result<Option<LogId>> {
        if let Some(id) = self.state.borrow().id {
            return Ok(Some(id));
        }
        let dir = self.store.root().join(&self.spec.key.dir_name);
        if !create && !self.store.fs().exists(&dir).await {
            return Ok(None);
        }
        let (id, report) = self
            .store
            .open_log(self.spec.key.clone(), self.spec.config.clone(), now_ms)
            .await
            .map_err(io_err)?;
        if !report.problems.is_empty() {
            tracing::warn!(dir = %self.spec.key.dir_name, problems = ?report.problems, "recovered a side log");
        }
        if let Some(raced) = self.state.borrow().id {
            // Another caller opened it meanwhile (the store registers a key once).
            return Ok(Some(raced));
        }
        let records = read(&self.store, id, 0, None).await?;
        let mut state = self.state.borrow_mut();
        state.id = Some(id);
        state.offsets = records
            .into_iter()
            .map(|(off, s)| (s.index, (off, s.term)))
            .collect();
        state.recovered = state.offsets.keys().next_back().copied().unwrap_or(0);
        Ok(Some(id))
    }

    /// The highest index found at open.
    pub(super) fn recovered(&self) -> u64 {
        self.state.borrow().recovered
    }

    /// `(index, term)` of every stored record, in index order.
    pub(super) fn indexes(&self) -> Vec<(u64, Term)> {
        self.state
            .borrow()
            .offsets
            .iter()
            .map(|(i, (_, t))| (*i, *t))
            .collect()
    }

    /// Stages `side`; returns the ticket whose durability makes it durable.
    pub(super) async fn append(&self, side: StoredSide, now_ms: i64) -> io::Result<AppendTicket> {
        let Some(id) = self.open(true, now_ms).await? else {
            return Err(io::Error::other("the side log cannot be opened"));
        };
        let epoch = side.term.as_leader_epoch().ok_or_else(|| {
            io::Error::other(format!("term {} is beyond Kafka's leader epochs", side.term.0))
        })?;
        let mut value = Vec::with_capacity(PREFIX_BYTES + side.record.data.len());
        value.extend_from_slice(&side.index.to_be_bytes());
        value.extend_from_slice(&side.record.keep_from.to_be_bytes());
        value.extend_from_slice(&side.record.data);
        let bytes = batch(
            &[TestRecord {
                key: None,
                value: Some(&value),
                headers: vec![],
                timestamp_delta: 0,
            }],
            now_ms,
        );
        let mut state = self.state.borrow_mut();
        if let Some((last, _)) = state.offsets.last_key_value() {
            if *last >= side.index {
                return Err(io::Error::other(format!(
                    "side record {} appended after {last}",
                    side.index
                )));
            }
        }
        let ticket = self.store.append(id, &bytes, epoch.0, now_ms).map_err(io_err)?;
        state
            .offsets
            .insert(side.index, (ticket.info.base_offset, side.term));
        state.staged.insert(side.index, side);
        Ok(ticket)
    }

    /// Forgets staged copies of records that are durable now (up to `index`).
    pub(super) fn durable_up_to(&self, index: u64) {
        let mut state = self.state.borrow_mut();
        state.staged = state.staged.split_off(&(index + 1));
    }

    /// The records with indexes in `from..to`.
    pub(super) async fn records(&self, from: u64, to: u64) -> io::Result<Vec<StoredSide>> {
        if from >= to {
            return Ok(Vec::new());
        }
        self.open(false, 0).await?;
        let (id, start, staged) = {
            let state = self.state.borrow();
            let Some(id) = state.id else { return Ok(Vec::new()) };
            let Some((_, (start, _))) = state.offsets.range(from..to).next() else {
                return Ok(Vec::new());
            };
            let staged: Vec<StoredSide> = state.staged.range(from..to).map(|(_, s)| s.clone()).collect();
            (id, *start, staged)
        };
        let mut out: Vec<StoredSide> = read(&self.store, id, start, Some(to))
            .await?
            .into_iter()
            .map(|(_, s)| s)
            .filter(|s| s.index >= from)
            .collect();
        let durable_end = out.last().map(|s| s.index);
        out.extend(
            staged
                .into_iter()
                .filter(|s| durable_end.is_none_or(|d| s.index > d)),
        );
        Ok(out)
    }

    /// Drops the records with indexes at or after `from` (everything was made durable first).
    pub(super) async fn truncate_from(&self, from: u64) -> io::Result<()> {
        let (id, offset) = {
            let state = self.state.borrow();
            let Some(id) = state.id else { return Ok(()) };
            let Some((_, (offset, _))) = state.offsets.range(from..).next() else {
                return Ok(());
            };
            (id, *offset)
        };
        self.store.truncate_log(id, offset).await.map_err(io_err)?;
        let mut state = self.state.borrow_mut();
        state.offsets.split_off(&from);
        state.staged.split_off(&from);
        Ok(())
    }

    /// Lets the records before index `keep_from` go.
    pub(super) async fn trim(&self, keep_from: u64) -> io::Result<()> {
        let (id, offset) = {
            let state = self.state.borrow();
            let Some(id) = state.id else { return Ok(()) };
            if state.offsets.range(..keep_from).next().is_none() {
                return Ok(());
            }
            let offset = match state.offsets.range(keep_from..).next() {
                Some((_, (offset, _))) => *offset,
                None => self.store.offsets(id).map_err(io_err)?.log_end_offset,
            };
            (id, offset)
        };
        self.store.delete_records(id, offset).await.map_err(io_err)?;
        let mut state = self.state.borrow_mut();
        state.offsets = state.offsets.split_off(&keep_from);
        Ok(())
    }
}

/// Reads the side records stored at or after side offset `from`, up to the first with an index
/// at or after `to_index`: `(side offset, record)`.
async fn read<F: Fs>(
    store: &ShardStore<F>,
    id: LogId,
    from: i64,
    to_index: Option<u64>,
) -> io::Result<Vec<(i64, StoredSide)>> {
    let mut out = Vec::new();
    let start = store.offsets(id).map_err(io_err)?.log_start_offset;
    let mut at = from.max(start);
    loop {
        let Some(plan) = store
            .plan_replica_read(id, at, READ_CHUNK_BYTES)
            .map_err(io_err)?
        else {
            return Ok(out);
        };
        let bytes = plan.execute().await.map_err(io_err)?;
        if bytes.is_empty() {
            return Ok(out);
        }
        let mut progressed = false;
        for found in BatchScanner::new(&bytes, false) {
            let h = found.header;
            if h.next_offset() <= at {
                continue;
            }
            let end = found.position + h.total_bytes();
            let one = bytes.slice(found.position..end);
            let term = Term::from_leader_epoch(LeaderEpoch(h.partition_leader_epoch)).unwrap_or(Term(0));
            let side = decode(&one, term).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("side record at offset {}: {e}", h.base_offset),
                )
            })?;
            if to_index.is_some_and(|t| side.index >= t) {
                return Ok(out);
            }
            out.push((h.base_offset, side));
            at = h.next_offset();
            progressed = true;
        }
        if !progressed {
            return Ok(out);
        }
    }
}

fn decode(batch: &Bytes, term: Term) -> Result<StoredSide, String> {
    let records = decode_records(batch, MAX_DECOMPRESSED_BYTES).map_err(|e| format!("{e:?}"))?;
    let [record] = records.as_slice() else {
        return Err(format!("{} records where one is stored", records.len()));
    };
    let value = record.value.clone().unwrap_or_default();
    if value.len() < PREFIX_BYTES {
        return Err("a value shorter than its prefix".into());
    }
    let mut index = [0u8; 8];
    let mut keep_from = [0u8; 8];
    index.copy_from_slice(&value[..8]);
    keep_from.copy_from_slice(&value[8..PREFIX_BYTES]);
    Ok(StoredSide {
        index: u64::from_be_bytes(index),
        term,
        record: SideRecord {
            keep_from: u64::from_be_bytes(keep_from),
            data: value.slice(PREFIX_BYTES..),
        },
    })
}
