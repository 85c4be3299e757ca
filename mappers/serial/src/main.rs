//! `mapper-serial`: the serial mapper on the SDK (`--config-file config.yaml`).

fn main() -> std::process::ExitCode {
    mapper_sdk::main(mapper_serial::mapper::Serial)
}
