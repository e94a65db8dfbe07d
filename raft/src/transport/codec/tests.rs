use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

pub(crate) fn group(n: u8, partition: i32) -> GroupId {
    GroupId {
        topic: TopicId(uuid::Uuid::from_bytes([n; 16])),
        partition: PartitionId(partition),
    }
}

fn arb_group() -> impl Strategy<Value = GroupId> {
    (any::<[u8; 16]>(), any::<i32>()).prop_map(|(u, p)| GroupId {
        topic: TopicId(uuid::Uuid::from_bytes(u)),
        partition: PartitionId(p),
    })
}

fn arb_vote() -> impl Strategy<Value = PartitionVote> {
    (any::<u64>(), any::<u64>(), any::<bool>()).prop_map(|(term, node, committed)| {
        if committed {
            PartitionVote::new_committed(term, BrokerId(node))
        } else {
            PartitionVote::new(term, BrokerId(node))
        }
    })
}

fn arb_log_id() -> impl Strategy<Value = PartitionLogId> {
    (any::<u64>(), any::<u64>()).prop_map(|(t, i)| PartitionLogId::new_term_index(t, i))
}

fn arb_opt_log_id() -> impl Strategy<Value = Option<PartitionLogId>> {
    proptest::option::of(arb_log_id())
}

fn arb_membership() -> impl Strategy<Value = PartitionMembership> {
    (
        proptest::collection::vec(proptest::collection::btree_set(0u64..8, 1..4), 0..=2),
        proptest::collection::btree_set(0u64..8, 0..3),
    )
        .prop_map(|(configs, learners)| {
            let configs: Vec<BTreeSet<BrokerId>> = configs
                .into_iter()
                .map(|c| c.into_iter().map(BrokerId).collect())
                .collect();
            let nodes: BTreeMap<BrokerId, ()> = configs
                .iter()
                .flatten()
                .copied()
                .chain(learners.into_iter().map(BrokerId))
                .map(|id| (id, ()))
                .collect();
            Membership::new(configs, nodes).unwrap()
        })
}

fn arb_bytes() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from)
}

fn arb_stored_side() -> impl Strategy<Value = StoredSide> {
    (any::<u64>(), any::<u64>(), any::<u64>(), arb_bytes()).prop_map(|(index, term, keep_from, data)| {
        StoredSide {
            index,
            term: Term(term),
            record: SideRecord { keep_from, data },
        }
    })
}

fn arb_entry() -> impl Strategy<Value = PartitionEntry> {
    let payload = prop_oneof![
        Just(EntryPayload::Blank),
        arb_bytes().prop_map(|b| EntryPayload::Normal(EntryData::Batch(KafkaBatch(b)))),
        (any::<u64>(), arb_bytes()).prop_map(|(keep_from, data)| EntryPayload::Normal(EntryData::Side(
            SideRecord { keep_from, data }
        ))),
        arb_membership().prop_map(EntryPayload::Membership),
    ];
    (arb_log_id(), payload).prop_map(|(log_id, payload)| PartitionEntry { log_id, payload })
}

fn arb_vote_msg() -> impl Strategy<Value = VoteMsg> {
    (arb_vote(), arb_opt_log_id(), any::<bool>()).prop_map(|(vote, last_log_id, leadership_transfer)| {
        VoteMsg {
            vote,
            last_log_id,
            leadership_transfer,
        }
    })
}

fn arb_append_reply() -> impl Strategy<Value = AppendReply> {
    prop_oneof![
        Just(AppendReply::Success),
        arb_opt_log_id().prop_map(AppendReply::PartialSuccess),
        Just(AppendReply::Conflict),
        arb_vote().prop_map(AppendReply::HigherVote),
    ]
}

fn arb_meta() -> impl Strategy<Value = PartitionSnapshotMeta> {
    (arb_opt_log_id(), arb_opt_log_id(), arb_membership()).prop_map(|(last_log_id, mlid, m)| {
        PartitionSnapshotMeta {
            last_log_id,
            last_membership: StoredMembership::new(mlid, m),
        }
    })
}

fn arb_stored_batch() -> impl Strategy<Value = StoredBatch> {
    (any::<i64>(), any::<u64>(), arb_bytes()).prop_map(|(o, t, bytes)| StoredBatch {
        base_offset: Offset(o),
        term: Term(t),
        bytes,
    })
}

fn arb_heartbeat() -> impl Strategy<Value = Heartbeat> {
    (arb_group(), arb_vote(), arb_opt_log_id(), arb_opt_log_id()).prop_map(
        |(group, vote, prev_log_id, leader_commit)| Heartbeat {
            group,
            vote,
            prev_log_id,
            leader_commit,
        },
    )
}

fn arb_message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (arb_group(), arb_vote_msg()).prop_map(|(group, req)| Message::Vote { group, req }),
        (arb_group(), arb_vote_msg()).prop_map(|(group, req)| Message::PreVote { group, req }),
        (arb_group(), arb_vote(), any::<bool>(), arb_opt_log_id()).prop_map(
            |(group, vote, granted, last_log_id)| {
                Message::VoteReply {
                    group,
                    reply: VoteReply {
                        vote,
                        granted,
                        last_log_id,
                    },
                }
            }
        ),
        (
            arb_group(),
            arb_vote(),
            arb_opt_log_id(),
            arb_opt_log_id(),
            proptest::collection::vec(arb_entry(), 0..6)
        )
            .prop_map(
                |(group, vote, prev_log_id, leader_commit, entries)| Message::Append {
                    group,
                    req: AppendMsg {
                        vote,
                        prev_log_id,
                        leader_commit,
                        entries,
                    },
                }
            ),
        (arb_group(), arb_append_reply()).prop_map(|(group, reply)| Message::AppendReply { group, reply }),
        (
            arb_group(),
            arb_vote(),
            arb_meta(),
            any::<i64>(),
            any::<u32>(),
            any::<bool>(),
            proptest::collection::vec(arb_stored_batch(), 0..5),
            proptest::collection::vec(arb_stored_side(), 0..3)
        )
            .prop_map(|(group, vote, meta, next, chunk_index, last, batches, side)| {
                Message::Snapshot {
                    group,
                    chunk: SnapshotChunk {
                        vote,
                        meta,
                        next_offset: Offset(next),
                        chunk_index,
                        last,
                        batches,
                        side,
                    },
                }
            }),
        (arb_group(), arb_vote()).prop_map(|(group, vote)| Message::SnapshotReply {
            group,
            reply: SnapshotReply { vote },
        }),
        (arb_group(), arb_vote(), any::<u64>(), arb_opt_log_id()).prop_map(
            |(group, from_leader, to, last_log_id)| {
                Message::TransferLeader {
                    group,
                    req: TransferLeaderMsg {
                        from_leader,
                        to_node: BrokerId(to),
                        last_log_id,
                    },
                }
            }
        ),
        (arb_group(), Just(())).prop_map(|(group, ())| Message::TransferLeaderReply { group, reply: Ok(()) }),
        (arb_group(), arb_vote(), arb_vote()).prop_map(|(group, expected, actual)| {
            Message::TransferLeaderReply {
                group,
                reply: Err(TransferLeaderRejected::VoteChanged { expected, actual }),
            }
        }),
        (arb_group(), arb_opt_log_id(), arb_opt_log_id()).prop_map(|(group, expected, actual)| {
            Message::TransferLeaderReply {
                group,
                reply: Err(TransferLeaderRejected::LogNotFlushed { expected, actual }),
            }
        }),
        proptest::collection::vec(arb_heartbeat(), 0..8).prop_map(Message::Heartbeats),
        proptest::collection::vec(
            (arb_group(), arb_append_reply()).prop_map(|(group, reply)| HeartbeatReply { group, reply }),
            0..8
        )
        .prop_map(Message::HeartbeatReplies),
        (
            arb_group(),
            prop_oneof![
                Just(RefuseReason::UnknownGroup),
                Just(RefuseReason::Unavailable),
                Just(RefuseReason::Unsupported),
                Just(RefuseReason::Invalid)
            ]
        )
            .prop_map(|(group, reason)| Message::Refused { group, reason }),
        (any::<u64>(), any::<u16>()).prop_map(|(n, shard)| Message::Hello {
            node: BrokerId(n),
            shard
        }),
        (any::<u16>(), arb_bytes()).prop_map(|(kind, body)| Message::Control { kind, body }),
        proptest::option::of(arb_bytes()).prop_map(Message::ControlReply),
    ]
}

proptest! {
    #[test]
    fn every_message_round_trips(message in arb_message(), id in any::<u64>()) {
        let codec = Codec::default();
        let frame = Frame { request_id: RequestId(id), message };
        let bytes = codec.encode_to_bytes(&frame).unwrap();
        prop_assert_eq!(bytes.len(), codec.encoded_len(&frame.message));
        prop_assert_eq!(codec.decode_prefixed(bytes.clone()).unwrap(), frame.clone());
        // The stream decoder gives the same frame, and only once the whole frame is there.
        let mut buf = BytesMut::new();
        for (i, b) in bytes.iter().enumerate() {
            prop_assert_eq!(codec.decode_from(&mut buf).unwrap(), None, "frame complete after {} bytes", i);
            buf.put_u8(*b);
        }
        prop_assert_eq!(codec.decode_from(&mut buf).unwrap(), Some(frame));
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn arbitrary_bytes_decode_to_an_error_or_a_message(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let codec = Codec::new(1 << 10);
        let _ = codec.decode_prefixed(Bytes::from(bytes.clone()));
        let _ = codec.decode_frame(Bytes::from(bytes.clone()));
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(_)) = codec.decode_from(&mut buf) {}
    }

    /// Random bytes rarely get past the header; corrupting valid frames reaches the deep fields.
    #[test]
    fn corrupted_frames_decode_to_an_error_or_a_message(
        message in arb_message(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let codec = Codec::default();
        let bytes = codec.encode_to_bytes(&Frame { request_id: RequestId(1), message }).unwrap();
        let mut body = bytes[LENGTH_PREFIX_BYTES..].to_vec();
        for (at, value) in flips {
            let i = at.index(body.len());
            body[i] = value;
        }
        let _ = codec.decode_frame(Bytes::from(body.clone()));
        body.truncate(cut.index(body.len() + 1));
        let _ = codec.decode_frame(Bytes::from(body));
    }
}

#[test]
fn a_vote_request_encodes_to_these_bytes() {
    let frame = Frame {
        request_id: RequestId(0x0102),
        message: Message::Vote {
            group: group(0xab, 3),
            req: VoteMsg {
                vote: PartitionVote::new(7, BrokerId(2)),
                last_log_id: Some(PartitionLogId::new_term_index(6, 41)),
                leadership_transfer: false,
            },
        },
    };
    let bytes = Codec::default().encode_to_bytes(&frame).unwrap();
    let mut expected = vec![0, 0, 0, 65, 1, 1, 0, 0, 0, 0, 0, 0, 1, 2];
    expected.extend([0xab; 16]);
    expected.extend([0, 0, 0, 3]);
    expected.extend([0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 2, 0]);
    expected.extend([1, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 41]);
    expected.push(0);
    assert_eq!(&bytes[..], &expected[..]);
}

#[test]
fn decoded_batches_are_slices_of_the_frame() {
    let codec = Codec::default();
    let batch = Bytes::from(vec![7u8; 300]);
    let frame = Frame {
        request_id: RequestId(9),
        message: Message::Append {
            group: group(1, 0),
            req: AppendMsg {
                vote: PartitionVote::new_committed(1, BrokerId(1)),
                prev_log_id: None,
                leader_commit: None,
                entries: vec![PartitionEntry {
                    log_id: PartitionLogId::new_term_index(1, 1),
                    payload: EntryPayload::Normal(EntryData::Batch(KafkaBatch(batch.clone()))),
                }],
            },
        },
    };
    let wire = codec.encode_to_bytes(&frame).unwrap();
    let range = wire.as_ptr_range();
    let Message::Append { req, .. } = codec.decode_prefixed(wire.clone()).unwrap().message else {
        panic!("not an append");
    };
    let Some(PartitionEntry {
        payload: EntryPayload::Normal(EntryData::Batch(KafkaBatch(got))),
        ..
    }) = req.entries.first()
    else {
        panic!("no batch");
    };
    assert_eq!(got, &batch);
    assert!(
        range.contains(&got.as_ptr()),
        "the batch was copied out of the frame"
    );
}

#[test]
fn a_length_above_the_bound_is_refused_before_the_frame_arrives() {
    let codec = Codec::new(1 << 10);
    let mut buf = BytesMut::from(&[0u8, 0, 4, 1, WIRE_VERSION][..]);
    assert_eq!(
        codec.decode_from(&mut buf),
        Err(DecodeError::FrameTooLarge {
            frame_bytes: 1025,
            max_frame_bytes: 1024
        })
    );
}

#[test]
fn a_frame_above_the_bound_is_not_encoded() {
    let codec = Codec::new(64);
    let frame = Frame {
        request_id: RequestId(1),
        message: Message::Heartbeats(
            (0..10)
                .map(|i| Heartbeat {
                    group: group(i, 0),
                    vote: PartitionVote::new_committed(1, BrokerId(1)),
                    prev_log_id: None,
                    leader_commit: None,
                })
                .collect(),
        ),
    };
    let mut out = BytesMut::from(&b"xy"[..]);
    assert!(matches!(
        codec.encode(&frame, &mut out),
        Err(EncodeError::TooLarge { .. })
    ));
    assert_eq!(&out[..], b"xy", "a failed encode leaves the buffer as it was");
}

#[test]
fn a_count_beyond_the_frame_is_refused() {
    let codec = Codec::default();
    let mut body = vec![WIRE_VERSION, 10, 0, 0, 0, 0, 0, 0, 0, 1];
    body.extend(u32::MAX.to_be_bytes());
    assert_eq!(
        codec.decode_frame(Bytes::from(body)),
        Err(DecodeError::BadCount {
            what: "heartbeats",
            count: u32::MAX
        })
    );
}

#[test]
fn another_version_is_refused() {
    let codec = Codec::default();
    let frame = Frame {
        request_id: RequestId(1),
        message: Message::Heartbeats(vec![]),
    };
    let mut wire = codec.encode_to_bytes(&frame).unwrap().to_vec();
    wire[LENGTH_PREFIX_BYTES] = 2;
    assert_eq!(
        codec.decode_prefixed(Bytes::from(wire)),
        Err(DecodeError::UnsupportedVersion(2))
    );
}

#[test]
fn an_invalid_membership_is_refused() {
    // A config names node 5, which the node list lacks.
    let mut body = vec![WIRE_VERSION, 4, 0, 0, 0, 0, 0, 0, 0, 1];
    body.extend([0; 20]); // group
    body.extend([0; 17]); // vote
    body.extend([0, 0]); // prev, commit
    body.extend(1u32.to_be_bytes()); // one entry
    body.extend([0; 16]); // log id
    body.push(2); // membership
    body.extend(1u32.to_be_bytes());
    body.extend(1u32.to_be_bytes());
    body.extend(5u64.to_be_bytes());
    body.extend(0u32.to_be_bytes());
    assert_eq!(
        Codec::default().decode_frame(Bytes::from(body)),
        Err(DecodeError::Invalid("membership"))
    );
}

#[test]
fn a_control_request_encodes_to_these_bytes() {
    let frame = Frame {
        request_id: RequestId(7),
        message: Message::Control {
            kind: 0x0102,
            body: Bytes::from_static(b"ab"),
        },
    };
    let bytes = Codec::default().encode_to_bytes(&frame).unwrap();
    assert_eq!(
        &bytes[..],
        &[0, 0, 0, 18, 1, 14, 0, 0, 0, 0, 0, 0, 0, 7, 1, 2, 0, 0, 0, 2, b'a', b'b']
    );
    assert_eq!(Codec::default().decode_prefixed(bytes).unwrap(), frame);
}

#[test]
fn control_bodies_are_bounded_by_the_frame() {
    // A control body announcing more bytes than the frame holds.
    let mut raw = vec![0, 0, 0, 16, 1, 14, 0, 0, 0, 0, 0, 0, 0, 1, 0, 9];
    raw.extend_from_slice(&u32::MAX.to_be_bytes());
    raw[3] = u8::try_from(raw.len() - 4).unwrap();
    let e = Codec::default().decode_prefixed(Bytes::from(raw)).unwrap_err();
    assert!(matches!(e, DecodeError::BadCount { .. }), "{e:?}");
    // A reply tag that is neither absent nor present.
    let raw = vec![0, 0, 0, 11, 1, 15, 0, 0, 0, 0, 0, 0, 0, 1, 2];
    let e = Codec::default().decode_prefixed(Bytes::from(raw)).unwrap_err();
    assert_eq!(
        e,
        DecodeError::BadTag {
            what: "control reply",
            tag: 2
        }
    );
    // A reply for a node that serves no control requests is one tag byte.
    let frame = Frame {
        request_id: RequestId(1),
        message: Message::ControlReply(None),
    };
    let bytes = Codec::default().encode_to_bytes(&frame).unwrap();
    assert_eq!(bytes.len(), 4 + 10 + 1);
    assert_eq!(Codec::default().decode_prefixed(bytes).unwrap(), frame);
}
