//! `kectl validate` must never panic, whatever the input: garbage text, garbage YAML, and
//! well-formed YAML of random shape placed where a Device or a DeviceModel is expected.

use kectl::validate::validate_texts;
use proptest::prelude::*;

fn check(text: String) {
    let report = validate_texts(&[("fuzz.yaml".into(), text)]);
    // Every finding names a file and an object.
    for f in &report.findings {
        assert_eq!(f.file, "fuzz.yaml");
        assert!(!f.object.is_empty());
    }
}

/// Random YAML values, nested up to a few levels.
fn yaml_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("~".to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|n| format!("{n:?}")),
        "[a-zA-Z0-9 _.:/-]{0,12}".prop_map(|s| format!("{s:?}")),
        Just("\"1e400\"".to_string()),
        Just("18446744073709551616".to_string()),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            prop::collection::vec((field_name(), inner), 0..5).prop_map(|kv| {
                let body: Vec<String> =
                    kv.into_iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
                format!("{{{}}}", body.join(", "))
            }),
        ]
    })
}

/// Field names, biased to the real ones so the random values land inside the schema.
fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "name", "properties", "desired", "value", "visitors", "configData", "protocolName",
            "collectCycle", "reportCycle", "reportToCloud", "pushMethod", "mqtt", "http", "dbMethod",
            "TDEngine", "hostname", "methods", "propertyNames", "deviceModelRef", "protocol",
            "type", "accessMode", "minimum", "maximum", "stateReport", "metadata", "namespace",
        ]).prop_map(str::to_string),
        1 => "[a-zA-Z]{1,8}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        check(text);
    }

    #[test]
    fn yaml_like_text_never_panics(text in "[-:\\[\\]{}#&*!|>'\"%@` a-z0-9\n]{0,200}") {
        check(text);
    }

    #[test]
    fn random_specs_never_panic(kind in prop::sample::select(vec!["Device", "DeviceModel", "DeviceStatus"]),
                                spec in yaml_value(), status in yaml_value(), meta in yaml_value()) {
        check(format!("apiVersion: devices.kubeedge.io/v1beta1\nkind: {kind}\nmetadata: {meta}\nspec: {spec}\nstatus: {status}\n"));
        check(format!("apiVersion: devices.kubeedge.io/v1beta1\nkind: {kind}\nmetadata: {{name: x}}\nspec: {{properties: [{spec}], methods: [{status}]}}\n"));
    }
}

#[test]
fn deep_nesting_and_alias_bombs_are_errors_not_crashes() {
    check(format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)));
    check(format!("spec: {}", "{a: ".repeat(5_000)));
    let bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n";
    check(bomb.to_string());
    check("\u{feff}apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\n".into());
    check("---\n---\n...\n".into());
    check("apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: x}\nspec: {properties: [{name: a, desired: {value: \"1\"}}], deviceModelRef: {name: m}}\n---\napiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {name: m}\nspec: {properties: [{name: a, type: INT, minimum: \"NaN\", maximum: \"inf\"}]}\n".into());
}
