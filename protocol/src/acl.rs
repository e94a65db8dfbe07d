//! ACL operations as the protocol encodes them in `*_authorized_operations` bit fields
//! (KIP-430): bit `n` set means operation code `n` is allowed.
//!
//! Without an authorizer Kafka allows everything, so a describe that asks for the authorized
//! operations gets every operation its resource type supports (`AclEntry.supportedOperations`);
//! one that does not ask gets `i32::MIN` ([`NOT_REQUESTED`]).

/// An ACL operation, by its protocol code (`org.apache.kafka.common.acl.AclOperation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AclOperation {
    Read = 3,
    Write = 4,
    Create = 5,
    Delete = 6,
    Alter = 7,
    Describe = 8,
    ClusterAction = 9,
    DescribeConfigs = 10,
    AlterConfigs = 11,
    IdempotentWrite = 12,
}

/// What an `authorized_operations` field holds when the request did not ask for it.
pub const NOT_REQUESTED: i32 = i32::MIN;

const fn bits(ops: &[AclOperation]) -> i32 {
    let mut out = 0;
    let mut rest = ops;
    while let [first, tail @ ..] = rest {
        out |= 1 << (*first as u8);
        rest = tail;
    }
    out
}

use AclOperation::*;

/// The operations a topic supports.
pub const TOPIC_OPERATIONS: i32 = bits(&[
    Read,
    Write,
    Create,
    Describe,
    Delete,
    Alter,
    DescribeConfigs,
    AlterConfigs,
]);
/// The operations a group supports.
pub const GROUP_OPERATIONS: i32 = bits(&[Read, Describe, Delete]);
/// The operations the cluster supports.
pub const CLUSTER_OPERATIONS: i32 = bits(&[
    Create,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
    Alter,
    Describe,
]);

/// The `authorized_operations` answer for a resource supporting `all`, when `requested` (no
/// authorizer: everything is allowed).
pub const fn authorized(requested: bool, all: i32) -> i32 {
    if requested {
        all
    } else {
        NOT_REQUESTED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_fields_match_kafkas() {
        // The values Kafka 4 answers with no authorizer configured.
        assert_eq!(TOPIC_OPERATIONS, 3576);
        assert_eq!(GROUP_OPERATIONS, 328);
        assert_eq!(CLUSTER_OPERATIONS, 8096);
        assert_eq!(authorized(false, TOPIC_OPERATIONS), i32::MIN);
    }
}
