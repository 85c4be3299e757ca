//! `mapper-opcua`: the OPC UA mapper on the SDK (`--config-file config.yaml`).

fn main() -> std::process::ExitCode {
    mapper_sdk::main(mapper_opcua::mapper::OpcUa::default())
}
