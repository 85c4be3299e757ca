//! The `mapper-serial` binary refuses a configuration meant for another mapper and names why,
//! before it touches a port or edgecore's socket. (Also makes `cargo test --workspace` build the
//! binary, which the end-to-end tests in `hardware-tests/` run.)

use std::process::Command;

#[test]
fn refuses_a_config_for_another_protocol() {
    let dir = std::env::temp_dir().join(format!("mapper-serial-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("config.yaml");
    std::fs::write(
        &file,
        "grpc_server:\n  socket_path: /nonexistent/serial.sock\ncommon:\n  name: m\n  protocol: modbus\n  edgecore_sock: /nonexistent/dmi.sock\n",
    )
    .expect("write config");
    let out = Command::new(env!("CARGO_BIN_EXE_mapper-serial"))
        .arg("--config-file")
        .arg(&file)
        .output()
        .expect("run mapper-serial");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        stderr.contains("common.protocol is \"modbus\"") && stderr.contains("\"serial\""),
        "{stderr}"
    );
}

#[test]
fn names_a_missing_config_file() {
    let out = Command::new(env!("CARGO_BIN_EXE_mapper-serial"))
        .args(["--config-file", "/nonexistent/mapper-serial.yaml"])
        .output()
        .expect("run mapper-serial");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        stderr.contains("/nonexistent/mapper-serial.yaml"),
        "{stderr}"
    );
}
