//! Unit tests of the database and OTel sinks' encodings.

use super::*;

fn m(property: &str, value: &str, ty: Option<&str>) -> Message {
    Message {
        namespace: "default".into(),
        device: "plc 1".into(),
        property: property.into(),
        value: value.into(),
        value_type: ty.map(str::to_string),
        timestamp: 1_700_000_000_123,
    }
}

#[test]
fn line_protocol_is_typed_and_escaped() {
    let tags = vec![("site".to_string(), "hall 1,a=b".to_string())];
    assert_eq!(
        influxdb2::line(&m("temp", "42", Some("INT")), Some("plc"), &tags, None),
        "plc,device=default/plc\\ 1,site=hall\\ 1\\,a\\=b temp=42i 1700000000123"
    );
    assert_eq!(
        influxdb2::line(&m("p", "1.5", Some("FLOAT")), None, &[], Some("value")),
        "plc\\ 1,device=default/plc\\ 1 value=1.5 1700000000123"
    );
    assert!(
        influxdb2::line(&m("on", "true", Some("BOOLEAN")), Some("x"), &[], None)
            .contains(" on=true ")
    );
    assert!(
        influxdb2::line(&m("s", "say \"hi\"", Some("STRING")), Some("x"), &[], None)
            .contains(" s=\"say \\\"hi\\\"\" ")
    );
    // An INT value above i64 is a float field rather than a refused line.
    assert!(
        influxdb2::line(
            &m("big", "18446744073709551615", Some("INT")),
            Some("x"),
            &[],
            None
        )
        .contains(" big=1.8446744073709552e19 ")
    );
}

#[test]
fn otlp_request_has_a_gauge_per_property_and_skips_text() {
    let (body, skipped) = otel::request(&[
        m("temp", "42", Some("INT")),
        m("temp", "43", Some("INT")),
        m("p", "1.5", Some("DOUBLE")),
        m("label", "x", Some("STRING")),
    ]);
    assert_eq!(skipped, 1);
    let metrics = &body["resourceMetrics"][0]["scopeMetrics"][0]["metrics"];
    assert_eq!(metrics.as_array().map(Vec::len), Some(2));
    let temp = metrics
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == "temp"))
        .expect("temp");
    assert_eq!(temp["gauge"]["dataPoints"][1]["asInt"], "43");
    assert_eq!(
        temp["gauge"]["dataPoints"][0]["timeUnixNano"],
        "1700000000123000000"
    );
}
