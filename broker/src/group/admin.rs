//! Group administration: ListGroups, DescribeGroups, DeleteGroups and ConsumerGroupDescribe.

use std::collections::BTreeSet;

use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment as DescAssignment, DescribedGroup as ConsumerDescribed, Member,
    TopicPartitions as DescTopicPartitions,
};
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, DeleteGroupsRequest, DeleteGroupsResponse,
    DescribeGroupsRequest, DescribeGroupsResponse, ListGroupsRequest, ListGroupsResponse, TopicName,
};
use kafka_protocol::ResponseError;

use super::classic::ClassicState;
use super::records::Assignment;
use super::{sb, GroupCoordinator, GroupKind, GroupResponse, RequestMeta, RequestToken, TopicMetadata};

impl GroupCoordinator {
    pub(crate) fn list_groups(&mut self, token: RequestToken, meta: &RequestMeta, req: ListGroupsRequest) {
        let version = meta.version;
        let states: BTreeSet<String> = if version >= 4 {
            req.states_filter.iter().map(|s| s.to_lowercase()).collect()
        } else {
            BTreeSet::new()
        };
        let types: BTreeSet<String> = if version >= 5 {
            req.types_filter.iter().map(|s| s.to_lowercase()).collect()
        } else {
            BTreeSet::new()
        };
        let mut resp = ListGroupsResponse::default();
        if self.any_loading() {
            resp.error_code = ResponseError::CoordinatorLoadInProgress.code();
        }
        for (id, entry) in &self.groups {
            if self.check_group(id).is_err() {
                continue;
            }
            let (protocol_type, state, group_type) = match &entry.kind {
                GroupKind::Classic(g) => (
                    g.protocol_type.clone().unwrap_or_default(),
                    g.state.name(),
                    "classic",
                ),
                GroupKind::Consumer(g) => ("consumer".to_string(), g.state_name(), "consumer"),
            };
            if !states.is_empty() && !states.contains(&state.to_lowercase()) {
                continue;
            }
            if !types.is_empty() && !types.contains(group_type) {
                continue;
            }
            resp.groups.push(
                ListedGroup::default()
                    .with_group_id(kafka_protocol::messages::GroupId(sb(id)))
                    .with_protocol_type(sb(&protocol_type))
                    .with_group_state(if version >= 4 {
                        sb(state)
                    } else {
                        Default::default()
                    })
                    .with_group_type(if version >= 5 {
                        sb(group_type)
                    } else {
                        Default::default()
                    }),
            );
        }
        self.respond(token, version, GroupResponse::ListGroups(resp), &[]);
    }

    pub(crate) fn describe_groups(
        &mut self,
        token: RequestToken,
        meta: &RequestMeta,
        req: DescribeGroupsRequest,
    ) {
        let version = meta.version;
        let mut resp = DescribeGroupsResponse::default();
        let mut partitions = BTreeSet::new();
        let ops = strand_protocol::acl::authorized(
            version >= 3 && req.include_authorized_operations,
            strand_protocol::acl::GROUP_OPERATIONS,
        );
        for gid in &req.groups {
            let id = gid.as_str();
            let mut d = DescribedGroup::default()
                .with_group_id(gid.clone())
                .with_authorized_operations(ops);
            let fail = |d: &mut DescribedGroup, code: ResponseError, message: String| {
                d.error_code = code.code();
                if version >= 6 {
                    d.error_message = Some(sb(&message));
                }
            };
            if id.is_empty() {
                fail(
                    &mut d,
                    ResponseError::InvalidGroupId,
                    "The group id is empty.".into(),
                );
                resp.groups.push(d);
                continue;
            }
            match self.check_group(id) {
                Err(e) => fail(&mut d, e, format!("The coordinator cannot serve group {id} now.")),
                Ok(p) => {
                    partitions.insert(p);
                    match self.groups.get(id).map(|e| &e.kind) {
                        Some(GroupKind::Classic(g)) => {
                            let stable = g.state == ClassicState::Stable;
                            d.group_state = sb(g.state.name());
                            d.protocol_type = sb(g.protocol_type.as_deref().unwrap_or(""));
                            d.protocol_data = sb(if stable {
                                g.protocol_name.as_deref().unwrap_or("")
                            } else {
                                ""
                            });
                            let mut members: Vec<_> = g.members.values().collect();
                            members.sort_by(|a, b| a.member_id.cmp(&b.member_id));
                            d.members = members
                                .into_iter()
                                .map(|m| {
                                    DescribedGroupMember::default()
                                        .with_member_id(sb(&m.member_id))
                                        .with_group_instance_id(if version >= 4 {
                                            m.instance_id.as_deref().map(sb)
                                        } else {
                                            None
                                        })
                                        .with_client_id(sb(&m.client_id))
                                        .with_client_host(sb(&m.client_host))
                                        .with_member_metadata(if stable {
                                            m.metadata(g.protocol_name.as_deref())
                                        } else {
                                            Default::default()
                                        })
                                        .with_member_assignment(if stable {
                                            m.assignment.clone()
                                        } else {
                                            Default::default()
                                        })
                                })
                                .collect();
                        }
                        _ => {
                            // Unknown, or not a classic group: Kafka answers "Dead" (v0-v5) or
                            // GROUP_ID_NOT_FOUND (v6+).
                            d.group_state = sb("Dead");
                            if version >= 6 {
                                fail(
                                    &mut d,
                                    ResponseError::GroupIdNotFound,
                                    format!("Group {id} not found."),
                                );
                            }
                        }
                    }
                }
            }
            resp.groups.push(d);
        }
        let partitions: Vec<i32> = partitions.into_iter().collect();
        self.respond(token, version, GroupResponse::DescribeGroups(resp), &partitions);
    }

    pub(crate) fn delete_groups(
        &mut self,
        token: RequestToken,
        meta: &RequestMeta,
        req: DeleteGroupsRequest,
    ) {
        let version = meta.version;
        let mut resp = DeleteGroupsResponse::default();
        let mut partitions = BTreeSet::new();
        for gid in &req.groups_names {
            let id = gid.as_str().to_string();
            let code = if id.is_empty() {
                ResponseError::InvalidGroupId.code()
            } else {
                match self.check_group(&id) {
                    Err(e) => e.code(),
                    Ok(p) => {
                        partitions.insert(p);
                        let busy = match self.groups.get(&id).map(|e| &e.kind) {
                            None => Some(ResponseError::GroupIdNotFound),
                            Some(GroupKind::Classic(g)) if !g.is_empty() => {
                                Some(ResponseError::NonEmptyGroup)
                            }
                            Some(GroupKind::Consumer(g)) if !g.members.is_empty() => {
                                Some(ResponseError::NonEmptyGroup)
                            }
                            Some(_) => None,
                        };
                        match busy {
                            Some(e) => e.code(),
                            None => {
                                self.abort_parked(&id, ResponseError::CoordinatorNotAvailable.code());
                                let records = self.delete_group_records(&id);
                                self.write(p, records);
                                0
                            }
                        }
                    }
                }
            };
            resp.results.push(
                DeletableGroupResult::default()
                    .with_group_id(gid.clone())
                    .with_error_code(code),
            );
        }
        let partitions: Vec<i32> = partitions.into_iter().collect();
        self.respond(token, version, GroupResponse::DeleteGroups(resp), &partitions);
    }

    pub(crate) fn consumer_group_describe(
        &mut self,
        token: RequestToken,
        meta: &RequestMeta,
        req: ConsumerGroupDescribeRequest,
        topics: &dyn TopicMetadata,
    ) {
        let version = meta.version;
        let ops = strand_protocol::acl::authorized(
            req.include_authorized_operations,
            strand_protocol::acl::GROUP_OPERATIONS,
        );
        let describe = |a: &Assignment| {
            DescAssignment::default().with_topic_partitions(
                a.iter()
                    .filter_map(|(t, ps)| {
                        let (name, _) = topics.topic_by_id(*t)?;
                        Some(
                            DescTopicPartitions::default()
                                .with_topic_id(t.0)
                                .with_topic_name(TopicName(sb(&name)))
                                .with_partitions(ps.iter().copied().collect()),
                        )
                    })
                    .collect(),
            )
        };
        let mut resp = ConsumerGroupDescribeResponse::default();
        let mut partitions = BTreeSet::new();
        for gid in &req.group_ids {
            let id = gid.as_str();
            let mut d = ConsumerDescribed::default()
                .with_group_id(gid.clone())
                .with_authorized_operations(ops);
            match self.check_group(id) {
                Err(e) => {
                    d.error_code = e.code();
                    d.error_message = Some(sb(&format!("The coordinator cannot serve group {id} now.")));
                }
                Ok(p) => {
                    partitions.insert(p);
                    match self.groups.get(id).map(|e| &e.kind) {
                        Some(GroupKind::Consumer(g)) => {
                            d.group_state = sb(g.state_name());
                            d.group_epoch = g.group_epoch;
                            d.assignment_epoch = g.assignment_epoch;
                            d.assignor_name = sb(g.assignor());
                            let empty = Assignment::new();
                            d.members = g
                                .members
                                .values()
                                .map(|m| {
                                    Member::default()
                                        .with_member_id(sb(&m.member_id))
                                        .with_instance_id(m.instance_id.as_deref().map(sb))
                                        .with_rack_id(m.rack_id.as_deref().map(sb))
                                        .with_member_epoch(m.member_epoch)
                                        .with_client_id(sb(&m.client_id))
                                        .with_client_host(sb(&m.client_host))
                                        .with_subscribed_topic_names(
                                            m.subscribed_topic_names
                                                .iter()
                                                .map(|n| TopicName(sb(n)))
                                                .collect(),
                                        )
                                        .with_subscribed_topic_regex(
                                            m.subscribed_topic_regex.as_deref().map(sb),
                                        )
                                        .with_assignment(describe(&m.assigned))
                                        .with_target_assignment(describe(
                                            g.target.get(&m.member_id).unwrap_or(&empty),
                                        ))
                                        .with_member_type(if version >= 1 { 1 } else { -1 })
                                })
                                .collect();
                        }
                        Some(GroupKind::Classic(_)) => {
                            d.error_code = ResponseError::GroupIdNotFound.code();
                            d.error_message = Some(sb(&format!("Group {id} is not a consumer group.")));
                        }
                        None => {
                            d.error_code = ResponseError::GroupIdNotFound.code();
                            d.error_message = Some(sb(&format!("Group {id} not found.")));
                        }
                    }
                }
            }
            resp.groups.push(d);
        }
        let partitions: Vec<i32> = partitions.into_iter().collect();
        self.respond(
            token,
            version,
            GroupResponse::ConsumerGroupDescribe(resp),
            &partitions,
        );
    }
}
