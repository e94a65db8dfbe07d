//! ListPartitionReassignments (46): the reassignments in progress, of the partitions named (all
//! when none are). A partition's replica set is fixed once it is created (see
//! `replication`'s module documentation: a group's membership does not change), so no
//! reassignment is ever in progress and the answer lists none, as Kafka's does when none runs.

use std::rc::Rc;

use kafka_protocol::messages::{
    ApiKey, ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse,
};

use super::{Handler, Reply, RequestCtx};

pub(crate) struct ListPartitionReassignments;

impl Handler for ListPartitionReassignments {
    const KEY: ApiKey = ApiKey::ListPartitionReassignments;
    const MIN: i16 = 0;
    const MAX: i16 = 0;
    type Request = ListPartitionReassignmentsRequest;
    type Response = ListPartitionReassignmentsResponse;

    async fn handle(
        _ctx: Rc<RequestCtx>,
        _req: ListPartitionReassignmentsRequest,
    ) -> Reply<ListPartitionReassignmentsResponse> {
        Reply::Now(ListPartitionReassignmentsResponse::default())
    }

    fn error_codes(resp: &ListPartitionReassignmentsResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
