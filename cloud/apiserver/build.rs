//! Generates the etcd v3 client (the store's, `proto/etcd/v3.proto`) with the pure-Rust `protox`
//! compiler, so that building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["etcd/v3.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .emit_rerun_if_changed(false)
        .compile_fds(fds)?;
    Ok(())
}
