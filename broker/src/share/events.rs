//! What the share group coordinator tells the rest of the broker. The coordinator's host calls
//! these on the coordinator shard; each is a thin wrapper the share-fetch side fills in, so the
//! coordinator does not depend on how records are delivered.

use std::rc::Rc;

use crate::shard::Shard;

/// Member `member_id` of share group `group` is gone: it left (epoch -1) or its session expired.
/// The records it holds acquired are to be released on every shard (their delivery counts stay
/// as they are), so that the other members get them now rather than when their acquisition
/// locks expire. Called on the group's coordinator shard, once per member gone, after the
/// coordinator removed it (a ShareFetch of it now fails its member check).
pub(crate) fn member_gone(shard: &Rc<Shard>, group: &str, member_id: &str) {
    tracing::debug!(group, member = member_id, "share group member gone");
    release_member(shard, group, member_id);
}

/// The release itself, on every shard (the share-fetch side, [`crate::share_door`]); runs in
/// the background, since the coordinator's answer does not wait for it.
fn release_member(shard: &Rc<Shard>, group: &str, member_id: &str) {
    let (shard, group, member) = (shard.clone(), group.to_owned(), member_id.to_owned());
    glommio::spawn_local(async move { crate::share_door::member_gone(&shard, &group, &member).await })
        .detach();
}
