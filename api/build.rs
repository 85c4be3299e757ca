//! Generates the DMI protobuf and gRPC code with the pure-Rust `protox` compiler, so that building
//! needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["dmi/v1beta1/api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .compile_fds(fds)?;
    Ok(())
}
