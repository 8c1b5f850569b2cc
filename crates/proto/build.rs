//! Compiles the workspace's `proto/` with protox (pure Rust, no system `protoc`) and tonic-prost-build, and writes
//! the descriptor set that server reflection serves.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The proto files live at the workspace root (`proto/`), the public contract.
    let proto = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile(["oncegate/v1/oncegate.proto"], [proto])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let descriptor_path = out.join("oncegate_descriptor.bin");
    std::fs::write(&descriptor_path, prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
