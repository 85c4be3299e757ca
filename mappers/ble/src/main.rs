//! `mapper-ble`: the BLE mapper on the SDK (`--config-file config.yaml`).

fn main() -> std::process::ExitCode {
    mapper_sdk::main(mapper_ble::mapper::Ble::default())
}
