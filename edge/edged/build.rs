//! Generates edged's client of the Container Runtime Interface (a subset of CRI's `runtime.v1`)
//! with the pure-Rust `protox` compiler, so that building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let cri = protox::compile(["cri/v1/api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .build_server(false)
        .emit_rerun_if_changed(false)
        .compile_fds(cri)?;
    Ok(())
}
