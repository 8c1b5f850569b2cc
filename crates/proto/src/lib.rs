//! The generated protobuf and gRPC code, quarantined here so nothing else names `tonic::include_proto!`.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("oncegate.v1");

/// The encoded descriptor set of `proto/`, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("oncegate_descriptor");
