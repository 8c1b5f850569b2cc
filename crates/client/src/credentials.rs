//! The API key a client sends with every call, as `authorization: Bearer <key>`: checked once, when
//! it is given ([`GateClient::with_api_key`](crate::GateClient::with_api_key),
//! [`Resolver::with_api_key`](crate::Resolver::with_api_key)), then attached to each request.

use tonic::metadata::{Ascii, MetadataValue};

use crate::ClientError;

/// A principal's API key, ready to send.
#[derive(Debug, Clone)]
pub(crate) struct ApiKey(MetadataValue<Ascii>);

impl ApiKey {
    /// `Bearer <key>`; refused when `key` is not valid header text.
    pub(crate) fn new(key: &str) -> Result<Self, ClientError> {
        format!("Bearer {key}")
            .parse()
            .map(Self)
            .map_err(|_| ClientError::Invalid {
                field: "api_key".into(),
                description: "not valid header text".into(),
            })
    }
}

/// `message` as a request, carrying `key` when there is one.
pub(crate) fn request<T>(key: Option<&ApiKey>, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(ApiKey(value)) = key {
        request
            .metadata_mut()
            .insert("authorization", value.clone());
    }
    request
}
