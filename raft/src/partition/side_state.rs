//! A replica's Raft state beside its log, in one small file: the vote, the last snapshot
//! record, the purge point, the install marker and the internal entries above the purge point.
//! Everything in it changes rarely (elections, membership changes, snapshots every few thousand
//! entries), and each change writes the whole state again.
//!
//! The file is a journal of whole states ([`SideJournal`]): a change is appended as a new frame
//! and the last whole frame is the state. Appending costs no new inode, rename or directory
//! sync, which matters when thousands of groups vote at once; a journal past
//! [`SIDE_JOURNAL_BYTES`] is replaced by a file of one frame. A crash during an append leaves a
//! torn last frame, which reading ignores (that state was never durable, so never answered);
//! a whole, valid frame after a damaged one is corruption, not a torn write, and is refused.
//!
//! Frame layout (big-endian): magic `STRNDRS1`; `u32` body length; body; `u32` CRC-32C of the
//! body. Body: vote (`u8` present, `u64` term, `u64` node, `u8` committed); snapshot (`u8`
//! present, point, membership log id (`u8` present, `u64` term, `u64` index), membership);
//! purge point (`u8` present, point); install marker (`u8` present, `i64` offset); `u32`
//! internal entry count, each `u64` index, `u64` term, `u8` has membership, membership. A point
//! is `u64` term, `u64` index, `i64` next offset. A membership is `u16` config count, each
//! `u16` voter count and `u64` voters, then `u16` node count and `u64` nodes.
//!
//! Decoding never panics and never allocates beyond the bytes it was given.

use std::collections::{BTreeMap, BTreeSet};

use openraft::vote::leader_id_std::CommittedLeaderId;
use openraft::{LogId, Membership, StoredMembership};
use strand_protocol::types::Offset;

use super::entry_map::PurgePoint;
use super::replica_log::{InternalEntry, SnapshotRecord, StoredVote};
use super::types::BrokerId;
use crate::Term;

const MAGIC: &[u8; 8] = b"STRNDRS1";
/// Bound on what one file may hold: far above any real state (a handful of internal entries).
pub const MAX_SIDE_STATE_BYTES: usize = 4 << 20;
/// A journal that would grow past this many bytes is replaced by one frame instead: one page,
/// some thirty votes, so that reading every replica's file at start-up stays cheap.
pub const SIDE_JOURNAL_BYTES: u64 = 4_096;

/// What a side file holds: the last whole state, and where its valid frames end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SideJournal {
    pub state: SideState,
    /// The length of the valid frames; a file longer than this ends in a torn frame, and
    /// the next write must replace the file rather than append after it.
    pub valid_bytes: u64,
}

/// Everything a replica keeps beside its log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SideState {
    pub vote: Option<StoredVote>,
    pub snapshot: Option<SnapshotRecord>,
    pub purged: Option<PurgePoint>,
    pub installing_from: Option<Offset>,
    pub internal: BTreeMap<u64, InternalEntry>,
}

type Members = Membership<BrokerId, ()>;

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn point(&mut self, p: &PurgePoint) {
        self.u64(p.term.0);
        self.u64(p.index);
        self.i64(p.next_offset.0);
    }
    fn members(&mut self, m: &Members) {
        let configs = m.get_joint_config();
        self.u16(u16::try_from(configs.len()).unwrap_or(u16::MAX));
        for c in configs.iter().take(usize::from(u16::MAX)) {
            self.u16(u16::try_from(c.len()).unwrap_or(u16::MAX));
            for id in c.iter().take(usize::from(u16::MAX)) {
                self.u64(id.0);
            }
        }
        let nodes: Vec<u64> = m.nodes().map(|(id, _)| id.0).collect();
        self.u16(u16::try_from(nodes.len()).unwrap_or(u16::MAX));
        for id in nodes.iter().take(usize::from(u16::MAX)) {
            self.u64(*id);
        }
    }
}

struct Reader<'a>(&'a [u8]);

type R<T> = Result<T, String>;

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        if self.0.len() < n {
            return Err(format!(
                "side state ends early: {n} bytes wanted, {} left",
                self.0.len()
            ));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> R<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> R<u8> {
        Ok(self.array::<1>()?[0])
    }
    fn flag(&mut self) -> R<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(format!("bad flag byte {b}")),
        }
    }
    fn u16(&mut self) -> R<u16> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> R<u32> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> R<u64> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    fn i64(&mut self) -> R<i64> {
        Ok(i64::from_be_bytes(self.array()?))
    }
    fn point(&mut self) -> R<PurgePoint> {
        Ok(PurgePoint {
            term: Term(self.u64()?),
            index: self.u64()?,
            next_offset: Offset(self.i64()?),
        })
    }
    /// A count of items at least `item_bytes` long each, checked against what is left.
    fn count(&mut self, n: usize, item_bytes: usize) -> R<usize> {
        if n.saturating_mul(item_bytes) > self.0.len() {
            return Err(format!("{n} items cannot fit in {} bytes", self.0.len()));
        }
        Ok(n)
    }
    fn members(&mut self) -> R<Members> {
        let n = usize::from(self.u16()?);
        let n = self.count(n, 2)?;
        let mut configs = Vec::with_capacity(n);
        for _ in 0..n {
            let k = usize::from(self.u16()?);
            let k = self.count(k, 8)?;
            let mut voters = BTreeSet::new();
            for _ in 0..k {
                voters.insert(BrokerId(self.u64()?));
            }
            configs.push(voters);
        }
        let k = usize::from(self.u16()?);
        let k = self.count(k, 8)?;
        let mut nodes = BTreeMap::new();
        for _ in 0..k {
            nodes.insert(BrokerId(self.u64()?), ());
        }
        Membership::new(configs, nodes).map_err(|e| format!("bad membership: {e}"))
    }
}

/// The body of the frame at the start of `bytes`, and the bytes after it.
fn frame(bytes: &[u8]) -> R<(&[u8], &[u8])> {
    let mut r = Reader(bytes);
    if r.take(8)? != MAGIC {
        return Err("not a side state frame (bad magic)".into());
    }
    let len = usize::try_from(r.u32()?).map_err(|_| "bad length")?;
    let body = r.take(len)?;
    let crc = r.u32()?;
    if crc32c::crc32c(body) != crc {
        return Err("side state fails its CRC".into());
    }
    Ok((body, r.0))
}

impl SideState {
    /// The state as one frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(256));
        match &self.vote {
            Some(v) => {
                w.u8(1);
                w.u64(v.term.0);
                w.u64(v.node.0);
                w.u8(u8::from(v.committed));
            }
            None => w.u8(0),
        }
        match &self.snapshot {
            Some(s) => {
                w.u8(1);
                w.point(&s.last);
                match s.membership.log_id() {
                    Some(id) => {
                        w.u8(1);
                        w.u64(id.leader_id.term);
                        w.u64(id.index);
                    }
                    None => w.u8(0),
                }
                w.members(s.membership.membership());
            }
            None => w.u8(0),
        }
        match &self.purged {
            Some(p) => {
                w.u8(1);
                w.point(p);
            }
            None => w.u8(0),
        }
        match self.installing_from {
            Some(o) => {
                w.u8(1);
                w.i64(o.0);
            }
            None => w.u8(0),
        }
        w.u32(u32::try_from(self.internal.len()).unwrap_or(u32::MAX));
        for e in self.internal.values() {
            w.u64(e.index);
            w.u64(e.term.0);
            match &e.membership {
                Some(m) => {
                    w.u8(1);
                    w.members(m);
                }
                None => w.u8(0),
            }
        }
        let body = w.0;
        let mut out = Vec::with_capacity(body.len() + 16);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        out
    }

    /// Decodes a file of exactly one frame.
    pub fn decode(bytes: &[u8]) -> R<SideState> {
        if bytes.len() > MAX_SIDE_STATE_BYTES {
            return Err(format!("side state of {} bytes is over the bound", bytes.len()));
        }
        let (body, rest) = frame(bytes)?;
        if !rest.is_empty() {
            return Err("bytes after the side state".into());
        }
        Self::decode_body(body)
    }

    /// Decodes a journal: its last whole frame (see the module documentation). An empty file
    /// holds the default state; a file whose first frame is damaged, or with a valid frame
    /// after a damaged one, is refused.
    pub fn decode_journal(bytes: &[u8]) -> R<SideJournal> {
        if bytes.len() > MAX_SIDE_STATE_BYTES {
            return Err(format!("side state of {} bytes is over the bound", bytes.len()));
        }
        let mut last = None;
        let mut rest = bytes;
        while !rest.is_empty() {
            let Ok((body, after)) = frame(rest) else { break };
            last = Some(body);
            rest = after;
        }
        let valid = bytes.len() - rest.len();
        if !rest.is_empty() {
            // A torn append is the last frame's; a whole frame further on means damage.
            let damaged =
                (1..rest.len()).any(|at| rest[at..].starts_with(MAGIC) && frame(&rest[at..]).is_ok());
            if damaged || last.is_none() {
                return Err(format!("side state damaged at byte {valid}"));
            }
        }
        let state = match last {
            Some(body) => Self::decode_body(body)?,
            None => SideState::default(),
        };
        Ok(SideJournal {
            state,
            valid_bytes: u64::try_from(valid).unwrap_or(u64::MAX),
        })
    }

    fn decode_body(body: &[u8]) -> R<SideState> {
        let mut r = Reader(body);
        let vote = if r.flag()? {
            Some(StoredVote {
                term: Term(r.u64()?),
                node: BrokerId(r.u64()?),
                committed: r.flag()?,
            })
        } else {
            None
        };
        let snapshot = if r.flag()? {
            let last = r.point()?;
            let log_id = if r.flag()? {
                Some(LogId::<CommittedLeaderId<u64>>::new_term_index(
                    r.u64()?,
                    r.u64()?,
                ))
            } else {
                None
            };
            let members = r.members()?;
            Some(SnapshotRecord {
                last,
                membership: StoredMembership::new(log_id, members),
            })
        } else {
            None
        };
        let purged = if r.flag()? { Some(r.point()?) } else { None };
        let installing_from = if r.flag()? { Some(Offset(r.i64()?)) } else { None };
        let n = usize::try_from(r.u32()?).map_err(|_| "bad count")?;
        let n = r.count(n, 17)?;
        let mut internal = BTreeMap::new();
        for _ in 0..n {
            let index = r.u64()?;
            let term = Term(r.u64()?);
            let membership = if r.flag()? { Some(r.members()?) } else { None };
            internal.insert(
                index,
                InternalEntry {
                    index,
                    term,
                    membership,
                },
            );
        }
        if !r.0.is_empty() {
            return Err("bytes after the side state's fields".into());
        }
        Ok(SideState {
            vote,
            snapshot,
            purged,
            installing_from,
            internal,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn members() -> impl Strategy<Value = Members> {
        (
            proptest::collection::btree_set(1u64..8, 1..4),
            proptest::collection::btree_set(1u64..12, 0..3),
        )
            .prop_map(|(voters, learners)| {
                let voters: BTreeSet<BrokerId> = voters.into_iter().map(BrokerId).collect();
                let mut nodes: BTreeMap<BrokerId, ()> = voters.iter().map(|v| (*v, ())).collect();
                nodes.extend(learners.into_iter().map(|l| (BrokerId(l), ())));
                Membership::new(vec![voters], nodes).expect("valid")
            })
    }

    fn point() -> impl Strategy<Value = PurgePoint> {
        (0u64..100, 0u64..10_000, 0i64..1_000_000).prop_map(|(t, i, o)| PurgePoint {
            term: Term(t),
            index: i,
            next_offset: Offset(o),
        })
    }

    fn state() -> impl Strategy<Value = SideState> {
        (
            proptest::option::of((0u64..100, 0u64..10, any::<bool>())),
            proptest::option::of((
                point(),
                proptest::option::of((0u64..100, 0u64..10_000)),
                members(),
            )),
            proptest::option::of(point()),
            proptest::option::of(0i64..1_000_000),
            proptest::collection::vec((0u64..10_000, 0u64..100, proptest::option::of(members())), 0..6),
        )
            .prop_map(|(vote, snap, purged, installing, internal)| SideState {
                vote: vote.map(|(t, n, c)| StoredVote {
                    term: Term(t),
                    node: BrokerId(n),
                    committed: c,
                }),
                snapshot: snap.map(|(last, id, m)| SnapshotRecord {
                    last,
                    membership: StoredMembership::new(id.map(|(t, i)| LogId::new_term_index(t, i)), m),
                }),
                purged,
                installing_from: installing.map(Offset),
                internal: internal
                    .into_iter()
                    .map(|(i, t, m)| {
                        (
                            i,
                            InternalEntry {
                                index: i,
                                term: Term(t),
                                membership: m,
                            },
                        )
                    })
                    .collect(),
            })
    }

    proptest! {
        #[test]
        fn round_trips(s in state()) {
            prop_assert_eq!(SideState::decode(&s.encode()), Ok(s));
        }

        /// Hostile or damaged bytes decode to an error, never a panic; a flipped bit fails the CRC.
        #[test]
        fn damaged_files_are_refused(s in state(), flip in any::<usize>(), junk in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut bytes = s.encode();
            let at = flip % bytes.len();
            bytes[at] ^= 0x10;
            prop_assert!(SideState::decode(&bytes).is_err());
            let _ = SideState::decode(&junk);
            let mut long = MAGIC.to_vec();
            long.extend_from_slice(&junk);
            let _ = SideState::decode(&long);
        }
    }

    proptest! {
        /// A journal reads as its last whole frame; a torn last frame is ignored and reported
        /// by where the valid frames end.
        #[test]
        fn a_journal_reads_as_its_last_whole_frame(
            states in proptest::collection::vec(state(), 1..5),
            torn in state(),
            cut in any::<usize>(),
        ) {
            let mut file = Vec::new();
            for s in &states {
                file.extend(s.encode());
            }
            let whole = file.len() as u64;
            let last = states.last().cloned().unwrap_or_default();
            prop_assert_eq!(
                SideState::decode_journal(&file),
                Ok(SideJournal { state: last.clone(), valid_bytes: whole })
            );
            let torn = torn.encode();
            file.extend_from_slice(&torn[..cut % torn.len()]);
            prop_assert_eq!(
                SideState::decode_journal(&file),
                Ok(SideJournal { state: last, valid_bytes: whole })
            );
        }

        /// Damage before the last frame is refused, not read as a torn write: the frames
        /// after it were durable, and reading an older one would forget a vote.
        #[test]
        fn damage_before_the_last_frame_is_refused(
            states in proptest::collection::vec(state(), 2..5),
            which in any::<usize>(),
            flip in any::<usize>(),
        ) {
            let frames: Vec<Vec<u8>> = states.iter().map(SideState::encode).collect();
            let damaged = which % (frames.len() - 1);
            let mut file = Vec::new();
            for (i, f) in frames.iter().enumerate() {
                let mut f = f.clone();
                if i == damaged {
                    let at = flip % f.len();
                    f[at] ^= 0x10;
                }
                file.extend(f);
            }
            prop_assert!(SideState::decode_journal(&file).is_err());
        }
    }

    #[test]
    fn an_empty_journal_is_the_default_state() {
        assert_eq!(
            SideState::decode_journal(&[]),
            Ok(SideJournal {
                state: SideState::default(),
                valid_bytes: 0
            })
        );
    }

    #[test]
    fn an_empty_membership_round_trips() {
        let s = SideState {
            snapshot: Some(SnapshotRecord {
                last: PurgePoint {
                    term: Term(0),
                    index: 0,
                    next_offset: Offset(0),
                },
                membership: StoredMembership::default(),
            }),
            ..SideState::default()
        };
        assert_eq!(SideState::decode(&s.encode()), Ok(s));
    }
}
