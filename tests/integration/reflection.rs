//! Server reflection describes the error details too: a reflection client (grpcurl does exactly
//! this) resolves `google.rpc.ErrorInfo` and every file it imports through the reflection service
//! alone, and with those descriptors decodes the `Any` details of a real refusal.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use prost_reflect::{DescriptorPool, DynamicMessage, Value};
use tonic::Code;
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

use crate::support::{Kind, TestGate, expect_error, token_request};

/// One reflection request, answered with the encoded file descriptors it names.
async fn files(
    client: &mut ServerReflectionClient<tonic::transport::Channel>,
    request: MessageRequest,
) -> Vec<prost_types::FileDescriptorProto> {
    let stream = tokio_stream::iter([ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    }]);
    let mut answers = client
        .server_reflection_info(stream)
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    match answer.message_response.unwrap() {
        MessageResponse::FileDescriptorResponse(files) => files
            .file_descriptor_proto
            .iter()
            .map(|bytes| prost_types::FileDescriptorProto::decode(bytes.as_slice()).unwrap())
            .collect(),
        other => panic!("no descriptors for the request: {other:?}"),
    }
}

#[tokio::test]
async fn reflection_serves_the_error_details_and_a_client_decodes_them() {
    let gate = TestGate::start(Kind::Embedded).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", gate.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut reflection = ServerReflectionClient::new(channel);

    // Resolve the symbol, then every import, by file name, as grpcurl does.
    let mut known: BTreeMap<String, prost_types::FileDescriptorProto> = BTreeMap::new();
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    for file in files(
        &mut reflection,
        MessageRequest::FileContainingSymbol("google.rpc.ErrorInfo".into()),
    )
    .await
    {
        wanted.extend(file.dependency.iter().cloned());
        known.insert(file.name().to_owned(), file);
    }
    assert!(
        known.contains_key("google/rpc/error_details.proto"),
        "{:?}",
        known.keys()
    );
    while let Some(name) = wanted.iter().find(|n| !known.contains_key(*n)).cloned() {
        for file in files(
            &mut reflection,
            MessageRequest::FileByFilename(name.clone()),
        )
        .await
        {
            wanted.extend(file.dependency.iter().cloned());
            known.insert(file.name().to_owned(), file);
        }
        assert!(known.contains_key(&name), "{name} is not served");
    }
    let pool = DescriptorPool::from_file_descriptor_set(prost_types::FileDescriptorSet {
        file: known.into_values().collect(),
    })
    .expect("the served descriptors form a complete set");

    // A real refusal's details decode with them alone.
    let mut client = gate.client().await;
    let mut req = token_request("a", "r", "pay", r#"{"amount":1}"#);
    req.idempotency_key = "k".into();
    client.request_token(req.clone()).await.unwrap();
    req.params_json = r#"{"amount":2}"#.into();
    let status = client.request_token(req).await.unwrap_err();
    expect_error(&status, Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED");
    let rich = tonic_types::pb::Status::decode(status.details()).unwrap();
    let any = &rich.details[0];
    let name = any.type_url.rsplit('/').next().unwrap();
    let descriptor = pool
        .get_message_by_name(name)
        .unwrap_or_else(|| panic!("{name} is not described"));
    let info = DynamicMessage::decode(descriptor, any.value.as_slice()).unwrap();
    assert_eq!(
        info.get_field_by_name("reason").unwrap().as_ref(),
        &Value::String("IDEMPOTENCY_KEY_REUSED".into())
    );
    assert_eq!(
        info.get_field_by_name("domain").unwrap().as_ref(),
        &Value::String("oncegate".into())
    );
}
