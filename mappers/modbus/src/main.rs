//! `mapper-modbus --config-file FILE`: the Modbus TCP/RTU mapper. The file is mapper-framework's
//! `config.yaml` (see `mapper_sdk::config`).

fn main() -> std::process::ExitCode {
    mapper_sdk::main(mapper_modbus::mapper::Modbus)
}
