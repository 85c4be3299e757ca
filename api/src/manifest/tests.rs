use super::*;
use proptest::prelude::*;

const DEVICE: &str = "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: NAME, namespace: default}\nspec:\n  deviceModelRef: {name: m}\n  protocol: {protocolName: modbus}\n  properties:\n    - {name: p0, visitors: {protocolName: modbus, configData: {offset: 0}}}\n";

/// One document of a manifest as people write them, good and bad.
fn arb_document() -> impl Strategy<Value = String> {
    let name = "[a-z][a-z0-9-]{0,10}";
    prop_oneof![
        4 => name.prop_map(|n| DEVICE.replace("NAME", &n)),
        1 => name.prop_map(|n| format!(
            "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {{name: {n}}}\nspec:\n  properties:\n    - {{name: p0, type: INT, accessMode: ReadWrite}}\n")),
        // A schema error: its problems and partial object.
        1 => name.prop_map(|n| format!(
            "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: {n}}}\nspec:\n  properties: notalist\n")),
        1 => Just("# only a comment\n".to_string()),
        1 => Just(String::new()),
        // A block scalar with lines that look like markers but are indented.
        1 => name.prop_map(|n| format!(
            "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: {n}\n  annotations:\n    note: |\n      ---\n      --- not a marker\n")),
        1 => Just("kind: [unclosed\n".to_string()),
        1 => Just("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n".to_string()),
    ]
}

/// How documents are joined: the marker alone, with a space, with CRLF, after an end marker,
/// with the document on the marker's line.
fn arb_text() -> impl Strategy<Value = (String, usize)> {
    let joint = prop_oneof![
        Just("---\n"),
        Just("--- \n"),
        Just("---\r\n"),
        Just("...\n---\n"),
        Just("--- # next\n"),
    ];
    (
        proptest::collection::vec((joint, arb_document()), 1..12),
        any::<bool>(),
        any::<bool>(),
        2usize..5,
    )
        .prop_map(|(docs, lead, directive, n)| {
            let mut text = String::new();
            if directive {
                text.push_str("%YAML 1.1\n");
            }
            for (i, (joint, doc)) in docs.iter().enumerate() {
                if i > 0 || lead || directive {
                    text.push_str(joint);
                }
                text.push_str(doc);
            }
            (text, n)
        })
}

fn shown(docs: &[Document]) -> String {
    format!("{docs:?}")
}

proptest! {
    /// Parsed in pieces or in one pass, a text gives the same documents, positions and
    /// problems, or is not cut at all.
    #[test]
    fn pieces_give_what_one_pass_gives((text, n) in arb_text()) {
        let one = parse_one_pass(&text).0;
        if let Some(cut) = pieces(&text, n) {
            prop_assert!(cut.len() >= 2 && cut.len() <= n);
            prop_assert_eq!(cut.concat(), text.clone());
            for p in &cut[1..] {
                prop_assert!(p.starts_with("---"), "{:?}", p);
            }
        }
        if let Some(docs) = parse_in_pieces(&text, n) {
            prop_assert_eq!(shown(&docs), shown(&one));
        }
    }
}

#[test]
fn a_site_in_one_file_is_parsed_in_pieces_with_the_positions_of_one_pass() {
    let mut text = String::new();
    for i in 0..300 {
        text.push_str("---\n");
        if i % 50 == 7 {
            // A schema error now and then, and an empty document.
            text.push_str("apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: bad}\nspec: {properties: 3}\n---\n# empty\n---\n");
        }
        text.push_str(&DEVICE.replace("NAME", &format!("dev-{i}")));
    }
    for n in 2..=4 {
        let cut = pieces(&text, n).expect("cut at its markers");
        assert_eq!(cut.len(), n);
        let docs = parse_in_pieces(&text, n).expect("no syntax error");
        assert_eq!(shown(&docs), shown(&parse_one_pass(&text).0));
        let last = docs.last().expect("documents");
        assert_eq!(last.name, "dev-299");
        assert_eq!(last.index, 300 + 2 * 6 - 1);
    }
    // A syntax error anywhere: one pass, its message as it was.
    text.push_str("---\nkind: [unclosed\n");
    assert!(parse_in_pieces(&text, 2).is_none());
    let docs = parse_documents(&text);
    assert!(
        docs.last()
            .is_some_and(|d| d.problems[0].message.contains("not valid YAML"))
    );
}
