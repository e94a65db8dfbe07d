//! Server-side assignors for KIP-848 consumer groups: `uniform` (the default, balanced and
//! sticky) and `range` (per topic, contiguous ranges over members sorted by id). Both are pure
//! functions of the members' subscriptions, the topics' partition counts and, for `uniform`, the
//! previous target assignment.

use std::collections::{BTreeMap, BTreeSet};

use strand_protocol::types::TopicId;

use super::records::Assignment;

/// Assignor names, the first being the default.
pub(crate) const ASSIGNORS: [&str; 2] = ["uniform", "range"];

/// One member as the assignor sees it.
pub(crate) struct AssignMember<'a> {
    pub(crate) id: &'a str,
    pub(crate) topics: BTreeSet<TopicId>,
    /// Its previous target assignment (stickiness).
    pub(crate) previous: Option<&'a Assignment>,
}

/// Computes the target assignment of every member. `partitions` gives each subscribed topic's
/// partition count.
pub(crate) fn assign(
    name: &str,
    members: &[AssignMember<'_>],
    partitions: &BTreeMap<TopicId, i32>,
) -> BTreeMap<String, Assignment> {
    if name == "range" {
        range(members, partitions)
    } else {
        uniform(members, partitions)
    }
}

fn range(members: &[AssignMember<'_>], partitions: &BTreeMap<TopicId, i32>) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|m| (m.id.to_string(), Assignment::new()))
        .collect();
    for (&topic, &count) in partitions {
        let mut subs: Vec<&str> = members
            .iter()
            .filter(|m| m.topics.contains(&topic))
            .map(|m| m.id)
            .collect();
        subs.sort_unstable();
        if subs.is_empty() || count <= 0 {
            continue;
        }
        let n = subs.len() as i32;
        let (quota, extra) = (count / n, count % n);
        let mut next = 0;
        for (i, id) in subs.iter().enumerate() {
            let take = quota + i32::from((i as i32) < extra);
            if take > 0 {
                if let Some(a) = out.get_mut(*id) {
                    a.entry(topic).or_default().extend(next..next + take);
                }
            }
            next += take;
        }
    }
    out
}

/// Balanced and sticky: keeps every previously assigned partition that is still valid, hands out
/// the unassigned ones to the eligible member with the fewest partitions, then moves partitions
/// from the most to the least loaded eligible members until no member has two more than another
/// member that could take one of its partitions.
fn uniform(
    members: &[AssignMember<'_>],
    partitions: &BTreeMap<TopicId, i32>,
) -> BTreeMap<String, Assignment> {
    let mut owner: BTreeMap<(TopicId, i32), usize> = BTreeMap::new();
    let mut held: Vec<BTreeSet<(TopicId, i32)>> = vec![BTreeSet::new(); members.len()];
    // Members in id order, so the result does not depend on the input order.
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by_key(|&i| members.get(i).map(|m| m.id));
    for &i in &order {
        let Some(m) = members.get(i) else { continue };
        let Some(prev) = m.previous else { continue };
        for (topic, ps) in prev {
            let Some(&count) = partitions.get(topic) else {
                continue;
            };
            if !m.topics.contains(topic) {
                continue;
            }
            for &p in ps {
                if p < count && !owner.contains_key(&(*topic, p)) {
                    owner.insert((*topic, p), i);
                    if let Some(h) = held.get_mut(i) {
                        h.insert((*topic, p));
                    }
                }
            }
        }
    }
    let eligible = |topic: &TopicId| -> Vec<usize> {
        order
            .iter()
            .copied()
            .filter(|&i| members.get(i).is_some_and(|m| m.topics.contains(topic)))
            .collect()
    };
    // Topics with the fewest eligible members first: they have the fewest choices.
    let mut topics: Vec<(TopicId, i32, Vec<usize>)> =
        partitions.iter().map(|(&t, &c)| (t, c, eligible(&t))).collect();
    topics.sort_by_key(|(t, _, e)| (e.len(), *t));
    for (topic, count, elig) in &topics {
        for p in 0..*count {
            if owner.contains_key(&(*topic, p)) {
                continue;
            }
            let best = elig.iter().copied().min_by_key(|&i| {
                (
                    held.get(i).map_or(usize::MAX, |h| h.len()),
                    members.get(i).map(|m| m.id),
                )
            });
            if let Some(i) = best {
                owner.insert((*topic, p), i);
                if let Some(h) = held.get_mut(i) {
                    h.insert((*topic, p));
                }
            }
        }
    }
    // Balance: bounded number of moves.
    let total: usize = held.iter().map(|h| h.len()).sum();
    for _ in 0..=total {
        let mut moved = false;
        // The most loaded member that has a partition a member with two fewer can take.
        let mut by_load = order.clone();
        by_load.sort_by_key(|&i| {
            (
                std::cmp::Reverse(held.get(i).map_or(0, |h| h.len())),
                members.get(i).map(|m| m.id),
            )
        });
        'outer: for &from in &by_load {
            let from_len = held.get(from).map_or(0, |h| h.len());
            let candidates: Vec<(TopicId, i32)> = held
                .get(from)
                .map(|h| h.iter().rev().copied().collect())
                .unwrap_or_default();
            for tp in candidates {
                let target = order
                    .iter()
                    .copied()
                    .filter(|&i| i != from && members.get(i).is_some_and(|m| m.topics.contains(&tp.0)))
                    .min_by_key(|&i| {
                        (
                            held.get(i).map_or(usize::MAX, |h| h.len()),
                            members.get(i).map(|m| m.id),
                        )
                    });
                if let Some(to) = target {
                    if held.get(to).map_or(usize::MAX, |h| h.len()) + 2 <= from_len {
                        if let Some(h) = held.get_mut(from) {
                            h.remove(&tp);
                        }
                        if let Some(h) = held.get_mut(to) {
                            h.insert(tp);
                        }
                        moved = true;
                        break 'outer;
                    }
                }
            }
        }
        if !moved {
            break;
        }
    }
    let mut out = BTreeMap::new();
    for (i, m) in members.iter().enumerate() {
        let mut a = Assignment::new();
        for (t, p) in held.get(i).into_iter().flatten() {
            a.entry(*t).or_default().insert(*p);
        }
        out.insert(m.id.to_string(), a);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tid(n: u128) -> TopicId {
        TopicId(uuid::Uuid::from_u128(n))
    }

    fn count(a: &Assignment) -> usize {
        a.values().map(|p| p.len()).sum()
    }

    fn member<'a>(id: &'a str, topics: &[TopicId], previous: Option<&'a Assignment>) -> AssignMember<'a> {
        AssignMember {
            id,
            topics: topics.iter().copied().collect(),
            previous,
        }
    }

    #[test]
    fn uniform_is_balanced_and_sticky() {
        let t = tid(1);
        let parts: BTreeMap<_, _> = [(t, 6)].into_iter().collect();
        let one = assign("uniform", &[member("a", &[t], None)], &parts);
        assert_eq!(count(&one["a"]), 6);
        let two = assign(
            "uniform",
            &[member("a", &[t], Some(&one["a"])), member("b", &[t], None)],
            &parts,
        );
        assert_eq!((count(&two["a"]), count(&two["b"])), (3, 3));
        assert!(two["a"][&t].is_subset(&one["a"][&t]), "a keeps its partitions");
        let three = assign(
            "uniform",
            &[
                member("a", &[t], Some(&two["a"])),
                member("b", &[t], Some(&two["b"])),
                member("c", &[t], None),
            ],
            &parts,
        );
        assert_eq!(
            [count(&three["a"]), count(&three["b"]), count(&three["c"])],
            [2, 2, 2]
        );
        assert!(three["a"][&t].is_subset(&two["a"][&t]));
        assert!(three["b"][&t].is_subset(&two["b"][&t]));
    }

    #[test]
    fn uniform_heterogeneous_subscriptions() {
        let (t1, t2) = (tid(1), tid(2));
        let parts: BTreeMap<_, _> = [(t1, 3), (t2, 3)].into_iter().collect();
        let out = assign(
            "uniform",
            &[member("a", &[t1], None), member("b", &[t1, t2], None)],
            &parts,
        );
        assert!(out["a"].keys().all(|t| *t == t1));
        assert_eq!(count(&out["a"]) + count(&out["b"]), 6);
        assert_eq!(count(&out["a"]), 3);
    }

    #[test]
    fn range_splits_per_topic() {
        let t = tid(1);
        let parts: BTreeMap<_, _> = [(t, 7)].into_iter().collect();
        let out = assign(
            "range",
            &[member("b", &[t], None), member("a", &[t], None)],
            &parts,
        );
        assert_eq!(out["a"][&t], (0..4).collect());
        assert_eq!(out["b"][&t], (4..7).collect());
    }
}
