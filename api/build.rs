//! Generates the DMI protobuf and gRPC code with the pure-Rust `protox` compiler, so that building
//! needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["dmi/v1beta1/api.proto"], ["proto"])?;
    // Kept for the tests that check the schema against KubeEdge's field numbers.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("dmi_v1beta1.fds"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .compile_fds(fds)?;
    Ok(())
}
