//! `devsim discover` as a user runs it, against pymodbus's Modbus TCP server (a simulator the
//! project did not write, `sims/modbus_server.py`, whose layout is known): what it drafts is
//! that layout (the float in each word order, the negative 16-bit value, the text, the hole at
//! 21-29), the draft passes `kectl validate` and `devsim --check`, and applied to edgecore with
//! mapper-modbus every drafted property reads the server's value; the starting HIL file it
//! writes (`--hil`) passes. The scan only reads: the writable registers hold what they held.

use std::process::Command;

fn run(bin: &std::path::Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(bin).args(args).output().expect("runs");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_draft_of_a_pymodbus_server_is_its_layout_and_reads_its_values() {
    let port = sim::free_port();
    let _server = sim::PyModbus::start(port);
    let dir = tempfile::tempdir().expect("tempdir");
    let draft = dir.path().join("draft.yaml");
    let devsim = std::path::PathBuf::from(env!("CARGO_BIN_EXE_devsim"));
    let (code, out) = run(
        &devsim,
        &[
            "discover",
            &format!("127.0.0.1:{port}"),
            "--units",
            "1-2",
            "--last-address",
            "60",
            "--name",
            "plc",
            "-o",
            draft.to_str().expect("path"),
            "--hil",
            dir.path().join("plc-hil.yaml").to_str().expect("path"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2 of 2 unit ids answered"), "{out}");
    let text = std::fs::read_to_string(&draft).expect("a draft");
    for want in [
        "- name: hr-0   # read 650",
        "- name: hr-1   # two registers that read as a float32 (ABCD): 123.456",
        "- name: hr-3   # two registers that read as a float32, low word first (CDAB): 123.456",
        "- name: hr-5   # 65534 as unsigned: a small negative number? read -2",
        "- name: hr-10   # 3 registers that read as text: \"PLC-7\"",
        "- name: hr-30   # read 30",
        "- name: coil-0   # read true",
        "- name: coil-1   # read false",
        "# Unit 2 answers exactly as unit 1",
        "configData: {register: HoldingRegister, offset: 3, dataType: float32, byteOrder: CDAB}",
    ] {
        assert!(text.contains(want), "{want}\nnot in:\n{text}");
    }
    // 21-29 refuse every read: nothing drafted there.
    for hole in 21..30 {
        assert!(
            !text.contains(&format!("name: hr-{hole} ")),
            "hr-{hole}:\n{text}"
        );
    }

    let kectl = sim::bin("kectl");
    let (code, out) = run(&kectl, &["validate", draft.to_str().expect("path")]);
    assert_eq!(code, 0, "kectl validate: {out}");
    assert!(out.contains("0 error(s)"), "{out}");
    let (code, out) = run(&devsim, &[draft.to_str().expect("path"), "--check"]);
    assert_eq!(code, 0, "devsim --check: {out}");

    // The starting HIL file: devsim holds the values read, and the twin reports each.
    let (code, out) = run(
        &devsim,
        &[
            "hil",
            dir.path().join("plc-hil.yaml").to_str().expect("path"),
        ],
    );
    assert_eq!(code, 0, "the drafted HIL run: {out}");
    assert!(out.contains("plc hr-1: reported 123.456"), "{out}");

    // Applied: every drafted property reads the server's value.
    let node = sim::Node::start(&text);
    let _mapper = node.mapper("mapper-modbus", "modbus", sim::free_port());
    for (prop, want) in [
        ("hr-0", "650"),
        ("hr-1", "123.456"),
        ("hr-3", "123.456"),
        ("hr-5", "-2"),
        ("hr-10", "PLC-7"),
        ("hr-30", "30"),
        ("hr-39", "39"),
        ("coil-0", "true"),
        ("coil-1", "false"),
    ] {
        sim::poll::eventually_or(60, &format!("{prop} = {want} in the twin"), || {
            let twin = node.twin("default/plc").unwrap_or_default();
            match sim::reported(&twin, prop).as_deref() == Some(want) {
                true => Ok(()),
                false => Err(format!("{:#}", twin["properties"][prop])),
            }
        });
    }
}
