//! The share group assignor ("simple", after Kafka's `SimpleAssignor`): every subscribed partition
//! goes to at least one member, every member with something to consume gets at least one
//! partition, and partitions are shared only when members outnumber them.
//!
//! Three passes over the partitions of the subscribed topics, in (topic id, partition) order:
//!
//! 1. Stickiness: a partition stays with a member that had it in the previous target assignment,
//!    as far as balance allows: `floor(partitions / members)` each, and one more for
//!    `partitions % members` of them.
//! 2. Balance: every partition still without a member goes to the subscribed member holding the
//!    fewest (ties: the earlier member id).
//! 3. Sharing: a subscribed member left with nothing (more members than partitions) takes the
//!    partition shared by the fewest members, preferring one it had before.
//!
//! Sharing a partition among members is safe in a share group: records are acquired one by one,
//! so two members never get the same record at once; it only spreads the load less evenly than
//! giving each member its own partitions, which is why it happens only when it must.

use std::collections::{BTreeMap, BTreeSet};

use strand_protocol::types::TopicId;

/// Partitions per topic.
pub(crate) type Assignment = BTreeMap<TopicId, BTreeSet<i32>>;

/// One member as the assignor sees it.
pub(crate) struct AssignMember<'a> {
    pub(crate) id: &'a str,
    /// The topics it subscribes to that exist.
    pub(crate) topics: BTreeSet<TopicId>,
    /// Its previous target assignment.
    pub(crate) previous: Option<&'a Assignment>,
}

/// The assignor's name, as ShareGroupDescribe reports it.
pub(crate) const NAME: &str = "simple";

/// Computes the target assignment of every member (members without any partition get an empty
/// assignment). `partitions`: the partition count of every subscribed topic that exists.
pub(crate) fn assign(
    members: &[AssignMember<'_>],
    partitions: &BTreeMap<TopicId, i32>,
) -> BTreeMap<String, Assignment> {
    // Every partition that some member subscribes to, with the members that may take it.
    let mut items: Vec<(TopicId, i32)> = Vec::new();
    let mut eligible: Vec<Vec<usize>> = Vec::new();
    for (topic, count) in partitions {
        let subscribers: Vec<usize> = members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.topics.contains(topic))
            .map(|(i, _)| i)
            .collect();
        if subscribers.is_empty() {
            continue;
        }
        for p in 0..(*count).max(0) {
            items.push((*topic, p));
            eligible.push(subscribers.clone());
        }
    }
    let had = |m: usize, (t, p): (TopicId, i32)| -> bool {
        members
            .get(m)
            .and_then(|m| m.previous)
            .and_then(|a| a.get(&t))
            .is_some_and(|ps| ps.contains(&p))
    };
    let mut load = vec![0usize; members.len()];
    let mut owners: Vec<Vec<usize>> = vec![Vec::new(); items.len()];
    // A balanced assignment gives `floor` partitions to every member and one more to `extra` of
    // them (exactly so when every member subscribes to the same topics).
    let active = members
        .iter()
        .enumerate()
        .filter(|(i, _)| eligible.iter().any(|e| e.contains(i)))
        .count()
        .max(1);
    let floor = items.len() / active;
    let mut extra = items.len() % active;

    // 1. Stickiness: up to `floor` each, then up to `floor + 1` for `extra` members.
    for limit in [floor, floor + 1] {
        for (i, item) in items.iter().enumerate() {
            if owners.get(i).is_some_and(|o| !o.is_empty()) {
                continue;
            }
            let Some(e) = eligible.get(i) else { continue };
            let keeper = e.iter().copied().find(|&m| {
                let l = load.get(m).copied().unwrap_or(usize::MAX);
                had(m, *item) && l < limit && (limit == floor || extra > 0)
            });
            if let Some(m) = keeper {
                if let (Some(o), Some(l)) = (owners.get_mut(i), load.get_mut(m)) {
                    o.push(m);
                    *l += 1;
                    if limit > floor {
                        extra = extra.saturating_sub(1);
                    }
                }
            }
        }
    }
    // 2. Balance.
    for (i, e) in eligible.iter().enumerate() {
        if owners.get(i).is_some_and(|o| !o.is_empty()) {
            continue;
        }
        if let Some(&m) = e.iter().min_by_key(|&&m| (load.get(m).copied().unwrap_or(0), m)) {
            if let (Some(o), Some(l)) = (owners.get_mut(i), load.get_mut(m)) {
                o.push(m);
                *l += 1;
            }
        }
    }
    // 3. Sharing.
    for m in 0..members.len() {
        if load.get(m).copied().unwrap_or(0) > 0 {
            continue;
        }
        let best = (0..items.len())
            .filter(|&i| eligible.get(i).is_some_and(|e| e.contains(&m)))
            .min_by_key(|&i| {
                let shared = owners.get(i).map_or(0, Vec::len);
                let previous = items.get(i).is_some_and(|item| had(m, *item));
                (shared, !previous, i)
            });
        if let Some(i) = best {
            if let (Some(o), Some(l)) = (owners.get_mut(i), load.get_mut(m)) {
                o.push(m);
                *l += 1;
            }
        }
    }

    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|m| (m.id.to_string(), Assignment::new()))
        .collect();
    for (item, os) in items.iter().zip(&owners) {
        for &m in os {
            if let Some(a) = members.get(m).and_then(|mm| out.get_mut(mm.id)) {
                a.entry(item.0).or_default().insert(item.1);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tid(n: u8) -> TopicId {
        TopicId(uuid::Uuid::from_bytes([n; 16]))
    }

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("m{i}")).collect()
    }

    fn run(
        ids: &[String],
        subs: &[&[TopicId]],
        parts: &BTreeMap<TopicId, i32>,
        prev: &BTreeMap<String, Assignment>,
    ) -> BTreeMap<String, Assignment> {
        let members: Vec<AssignMember<'_>> = ids
            .iter()
            .zip(subs)
            .map(|(id, s)| AssignMember {
                id,
                topics: s.iter().copied().collect(),
                previous: prev.get(id),
            })
            .collect();
        assign(&members, parts)
    }

    /// Members per partition.
    fn coverage(a: &BTreeMap<String, Assignment>) -> BTreeMap<(TopicId, i32), usize> {
        let mut c = BTreeMap::new();
        for asg in a.values() {
            for (t, ps) in asg {
                for p in ps {
                    *c.entry((*t, *p)).or_insert(0) += 1;
                }
            }
        }
        c
    }

    fn count(a: &Assignment) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    #[test]
    fn every_partition_and_every_member_is_covered_sharing_only_when_needed() {
        let t = tid(1);
        for partitions in [1, 2, 3, 4, 7] {
            for n in 1..=9usize {
                let ids = ids(n);
                let one = [t];
                let subs: Vec<&[TopicId]> = vec![&one[..]; n];
                let parts = BTreeMap::from([(t, partitions)]);
                let a = run(&ids, &subs, &parts, &BTreeMap::new());
                let c = coverage(&a);
                assert_eq!(
                    c.len(),
                    partitions as usize,
                    "{partitions} partitions, {n} members"
                );
                let p = partitions as usize;
                for members in c.values() {
                    // Shared only when members outnumber partitions, and evenly then.
                    assert!(*members >= 1);
                    assert!(*members <= n.div_ceil(p).max(1), "{partitions}/{n}: {c:?}");
                }
                for asg in a.values() {
                    let k = count(asg);
                    assert!(k >= 1, "{partitions}/{n}: a member got nothing");
                    assert!(k <= p.div_ceil(n), "{partitions}/{n}: {a:?}");
                }
            }
        }
    }

    #[test]
    fn sticky_when_a_member_joins_or_leaves() {
        let t = tid(1);
        let parts = BTreeMap::from([(t, 4)]);
        let three = ids(3);
        let a3 = run(&three, &[&[t], &[t], &[t]], &parts, &BTreeMap::new());
        // A fourth member joins: each of the three keeps at least one of its partitions.
        let four = ids(4);
        let a4 = run(&four, &[&[t], &[t], &[t], &[t]], &parts, &a3);
        for id in &three {
            let before = a3[id].get(&t).cloned().unwrap_or_default();
            let after = a4[id].get(&t).cloned().unwrap_or_default();
            assert!(!before.is_disjoint(&after), "{id}: {before:?} -> {after:?}");
        }
        assert!(a4.values().all(|a| count(a) == 1));
        // Recomputing with nothing changed changes nothing.
        assert_eq!(run(&four, &[&[t], &[t], &[t], &[t]], &parts, &a4), a4);
        // Five members over four partitions: stable too.
        let five = ids(5);
        let one = [t];
        let subs: Vec<&[TopicId]> = vec![&one[..]; 5];
        let a5 = run(&five, &subs, &parts, &a4);
        assert_eq!(run(&five, &subs, &parts, &a5), a5);
        assert_eq!(coverage(&a5).len(), 4);
    }

    #[test]
    fn heterogeneous_subscriptions() {
        let (a, b) = (tid(1), tid(2));
        let parts = BTreeMap::from([(a, 2), (b, 3)]);
        let ids = ids(3);
        // m0: a; m1: b; m2: a and b.
        let out = run(&ids, &[&[a], &[b], &[a, b]], &parts, &BTreeMap::new());
        assert_eq!(coverage(&out).len(), 5);
        assert!(out["m0"].keys().all(|t| *t == a));
        assert!(out["m1"].keys().all(|t| *t == b));
        assert!(out.values().all(|x| count(x) >= 1));
        // A member subscribed to nothing that exists gets an empty assignment.
        let out = run(&ids, &[&[a], &[tid(9)], &[a]], &parts, &BTreeMap::new());
        assert!(out["m1"].is_empty());
        assert_eq!(coverage(&out).len(), 2);
        // Topics no member subscribes to are not assigned.
        let out = run(&ids[..1], &[&[a]], &parts, &BTreeMap::new());
        assert_eq!(out["m0"], Assignment::from([(a, BTreeSet::from([0, 1]))]));
    }

    #[test]
    fn nothing_to_assign() {
        let out = run(&ids(2), &[&[], &[]], &BTreeMap::new(), &BTreeMap::new());
        assert!(out.values().all(Assignment::is_empty));
        assert!(assign(&[], &BTreeMap::from([(tid(1), 3)])).is_empty());
    }
}
