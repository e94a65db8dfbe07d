//! Share acknowledgements as Kafka sends them (batches of offsets with acknowledgement types:
//! 0 gap, 1 accept, 2 release, 3 reject), turned into the engine's settle items.

use kafka_protocol::ResponseError;
use strand_protocol::types::Offset;

use crate::queue::engine::{ConsumerId, Fence, MessageRef, SettleItem, SettleOp};

/// Acknowledgement items of one share request partition at most (bounds the work of one
/// request; the engine's lock limit bounds real ones far below).
const MAX_SHARE_ACK_ITEMS: usize = 20_000;

/// An acknowledgement batch of ShareFetch / ShareAcknowledge: offsets `first..=last` with one
/// type for all, or one per offset (0 gap, 1 accept, 2 release, 3 reject).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShareAcks {
    pub(crate) first: i64,
    pub(crate) last: i64,
    pub(crate) types: Vec<i8>,
}

/// The settle items of share acknowledgement batches: validated (ranges ascending, not
/// overlapping, types 0..=3, one type or one per offset), GAP offsets skipped (they have no
/// record to settle), RELEASE a failed attempt available again at once.
pub(crate) fn settle_items(
    batches: &[ShareAcks],
    owner: &ConsumerId,
) -> Result<Vec<SettleItem>, ResponseError> {
    let mut items = Vec::new();
    let mut prev_last: Option<i64> = None;
    for b in batches {
        let span = b
            .last
            .checked_sub(b.first)
            .and_then(|d| d.checked_add(1))
            .unwrap_or(0);
        if b.first < 0 || span <= 0 || prev_last.is_some_and(|p| b.first <= p) {
            return Err(ResponseError::InvalidRequest);
        }
        prev_last = Some(b.last);
        let per_offset = b.types.len() as i64 == span && span > 1;
        if !(b.types.len() == 1 || per_offset) {
            return Err(ResponseError::InvalidRequest);
        }
        if items.len() as i64 + span > MAX_SHARE_ACK_ITEMS as i64 {
            return Err(ResponseError::InvalidRequest);
        }
        for (k, off) in (b.first..=b.last).enumerate() {
            let t = if per_offset {
                b.types.get(k)
            } else {
                b.types.first()
            };
            let op = match t {
                Some(0) => continue,
                Some(1) => SettleOp::Ack,
                Some(2) => SettleOp::Nack { delay_ms: Some(0) },
                Some(3) => SettleOp::Reject,
                _ => return Err(ResponseError::InvalidRequest),
            };
            items.push(SettleItem {
                target: MessageRef::Offset(Offset(off)),
                fence: Fence::Owner(owner.clone()),
                op,
                reason: match op {
                    SettleOp::Reject => Some("rejected by the consumer".into()),
                    SettleOp::Nack { .. } => Some("released by the consumer".into()),
                    _ => None,
                },
            });
        }
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_acknowledgements_are_checked_and_expanded() {
        use crate::queue::engine::{Fence, MessageRef, SettleOp};
        use kafka_protocol::ResponseError as E;
        let owner = ConsumerId::new("m");
        let acks = |v: &[(i64, i64, &[i8])]| -> Vec<ShareAcks> {
            v.iter()
                .map(|(a, b, t)| ShareAcks {
                    first: *a,
                    last: *b,
                    types: t.to_vec(),
                })
                .collect()
        };
        // One type for a range, one per offset, GAPs skipped.
        let items = settle_items(&acks(&[(0, 2, &[1]), (5, 7, &[2, 0, 3])]), &owner).unwrap();
        let got: Vec<(i64, SettleOp)> = items
            .iter()
            .map(|i| match (&i.target, &i.fence) {
                (MessageRef::Offset(o), Fence::Owner(m)) if *m == owner => (o.0, i.op),
                _ => panic!("{i:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, SettleOp::Ack),
                (1, SettleOp::Ack),
                (2, SettleOp::Ack),
                (5, SettleOp::Nack { delay_ms: Some(0) }),
                (7, SettleOp::Reject)
            ]
        );
        // Overlapping, descending, empty or inverted ranges, bad types, wrong type counts.
        for bad in [
            acks(&[(0, 5, &[1]), (5, 6, &[1])]),
            acks(&[(5, 6, &[1]), (0, 1, &[1])]),
            acks(&[(3, 2, &[1])]),
            acks(&[(-1, 2, &[1])]),
            acks(&[(0, 0, &[4])]),
            acks(&[(0, 2, &[1, 1])]),
            acks(&[(0, 2, &[])]),
            acks(&[(0, i64::MAX, &[1])]),
        ] {
            assert_eq!(
                settle_items(&bad, &owner).unwrap_err(),
                E::InvalidRequest,
                "{bad:?}"
            );
        }
    }
}
