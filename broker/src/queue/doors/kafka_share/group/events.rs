//! What the share group coordinator tells the rest of the broker: a member is gone. The share
//! sessions of every shard hear of it ([`SessionsHost`]), so the coordinator does not depend on
//! how records are delivered.

use std::rc::Rc;

use futures::future::join_all;
use strand_protocol::types::ShardId;

use super::super::session::{MemberGone, SessionsHost};
use crate::shard::Shard;

/// Member `member_id` of share group `group` is gone: it left (epoch -1) or its session expired.
/// Its share sessions on every shard may acknowledge and close but acquire nothing more; what
/// it holds is settled by its last acknowledgements or its lock timeout. Called on the group's
/// coordinator shard, once per member gone, after the coordinator removed it (a ShareFetch of
/// it now fails its member check). Runs in the background: the coordinator's answer does not
/// wait for it.
pub(crate) fn member_gone(core: &Rc<Shard>, group: &str, member_id: &str) {
    tracing::debug!(group, member = member_id, "share group member gone");
    let (core, group, member) = (core.clone(), group.to_owned(), member_id.to_owned());
    glommio::spawn_local(async move {
        let calls = (0..core.shards).map(|s| {
            let gone = MemberGone {
                group: group.clone(),
                member: member.clone(),
            };
            core.ask::<SessionsHost>(ShardId(s), gone)
        });
        join_all(calls).await;
    })
    .detach();
}
