//! ApiVersions (18): the APIs and versions this broker serves, from the handler registry.

use std::rc::Rc;

use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::ResponseError;
use strand_protocol::header::encode_response_with_header_version;

use super::{Handler, Reply, RequestCtx, SUPPORTED};

pub(crate) struct ApiVersions;

fn api_keys() -> Vec<ApiVersion> {
    let mut keys: Vec<ApiVersion> = SUPPORTED
        .iter()
        .map(|&(key, min, max)| {
            ApiVersion::default()
                .with_api_key(key)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect();
    keys.sort_by_key(|k| k.api_key);
    keys
}

/// KIP-511: client software name and version must match `[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?`.
fn valid_software_field(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_alphanumeric();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            edge(first)
                && edge(last)
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'.')
        }
        _ => false,
    }
}

impl Handler for ApiVersions {
    const KEY: ApiKey = ApiKey::ApiVersions;
    const MIN: i16 = 0;
    const MAX: i16 = 4;
    type Request = ApiVersionsRequest;
    type Response = ApiVersionsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: ApiVersionsRequest) -> Reply<ApiVersionsResponse> {
        let mut resp = ApiVersionsResponse::default().with_api_keys(api_keys());
        if ctx.version >= 3
            && !(valid_software_field(req.client_software_name.as_str())
                && valid_software_field(req.client_software_version.as_str()))
        {
            resp.error_code = ResponseError::InvalidRequest.code();
        }
        Reply::Now(resp)
    }

    fn error_codes(resp: &ApiVersionsResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}

/// The answer to an ApiVersions request of a version above [`ApiVersions::MAX`]: v0 format (and
/// response header v0), UNSUPPORTED_VERSION, and the API list.
pub(crate) fn fallback(correlation_id: i32) -> Option<Bytes> {
    let resp = ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(api_keys());
    encode_response_with_header_version(correlation_id, 0, 0, &resp).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn software_fields() {
        assert!(valid_software_field("librdkafka"));
        assert!(valid_software_field("2.12.1-RC1"));
        assert!(!valid_software_field(""));
        assert!(!valid_software_field("-x"));
        assert!(!valid_software_field("a b"));
    }

    #[test]
    fn advertised_list_is_sorted_and_has_produce_from_v0() {
        let keys = api_keys();
        assert!(keys.windows(2).all(|w| w[0].api_key < w[1].api_key));
        let produce = keys.iter().find(|k| k.api_key == ApiKey::Produce as i16).unwrap();
        assert_eq!((produce.min_version, produce.max_version), (0, 13));
    }
}
