use super::*;

fn point(visitor: Value, ty: &str) -> Point {
    let hints = ModelHints {
        value_type: Some(ty.into()),
        ..ModelHints::default()
    };
    let Value::Object(v) = visitor else {
        panic!("an object")
    };
    Point::from_config("p", &v, &hints).expect("valid visitor")
}

/// A value must end at address 65535 at the latest: a two-register value at 65535 is
/// refused, naming `offset` (the mapper would send a request no device can answer).
#[test]
fn a_value_past_the_last_address_is_refused() {
    let hints = ModelHints::default();
    for (offset, data_type, ok) in [
        (65535, "uint16", true),
        (65534, "int32", true),
        (65535, "int32", false),
        (65532, "float64", true),
        (65533, "float64", false),
    ] {
        let Value::Object(v) = serde_json::json!({"register": "HoldingRegister", "offset": offset, "dataType": data_type})
        else {
            panic!("an object")
        };
        match Point::from_config("p", &v, &hints) {
            Ok(_) => assert!(ok, "{data_type} at {offset} taken"),
            Err(e) => {
                assert!(!ok, "{data_type} at {offset}: {e:?}");
                assert_eq!(e.key, "offset");
                assert!(e.reason.contains("go past 65535"), "{}", e.reason);
            }
        }
    }
}

/// A visitor that does not go with its model's type is refused against the type: a float
/// into an INT, text into a number, and a `limit` the model's type cannot be read from
/// (the width came from the type, so the type is named, not only the `limit`).
#[test]
fn a_visitor_that_does_not_go_with_the_models_type_names_the_type() {
    for (visitor, ty, key, says) in [
        (
            serde_json::json!({"register": "HoldingRegister", "offset": 0, "dataType": "float32"}),
            "INT",
            "dataType",
            "float32 gives fractions, which an INT property cannot hold",
        ),
        (
            serde_json::json!({"register": "HoldingRegister", "offset": 0, "dataType": "string", "limit": 2}),
            "FLOAT",
            "dataType",
            "string is text, which the property's type cannot hold (use type STRING); the model's type is FLOAT",
        ),
        (
            serde_json::json!({"register": "HoldingRegister", "offset": 0, "limit": 3}),
            "FLOAT",
            "limit",
            "3 registers do not fit the model's type FLOAT (a FLOAT is 2 registers, a float32)",
        ),
        (
            serde_json::json!({"register": "HoldingRegister", "offset": 0, "limit": 2}),
            "BOOLEAN",
            "limit",
            "the model's type BOOLEAN",
        ),
        (
            serde_json::json!({"register": "HoldingRegister", "offset": 0, "limit": 3, "dataType": "int32"}),
            "INT",
            "limit",
            "3 registers, but a int32 takes 2",
        ),
    ] {
        let hints = ModelHints {
            value_type: Some(ty.into()),
            ..ModelHints::default()
        };
        let Value::Object(v) = visitor else {
            panic!("an object")
        };
        let e = Point::from_config("p", &v, &hints).expect_err("refused");
        assert_eq!(e.key, key, "{}", e.reason);
        assert!(e.reason.contains(says), "{}", e.reason);
    }
    // What goes together is taken: a scaled integer into FLOAT, numbers into STRING.
    point(
        serde_json::json!({"register": "HoldingRegister", "offset": 0, "dataType": "int16", "scale": 0.1}),
        "FLOAT",
    );
    point(
        serde_json::json!({"register": "HoldingRegister", "offset": 0, "dataType": "uint32"}),
        "STRING",
    );
}

/// KubeEdge's keys without a `dataType` read registers as unsigned, as KubeEdge's mapper
/// does: 51234 in an INT register with `limit: 1` was -14302.
#[test]
fn registers_without_a_data_type_are_unsigned_as_in_kubeedge() {
    let int1 = point(
        serde_json::json!({"register": "HoldingRegister", "offset": 0, "limit": 1}),
        "INT",
    );
    assert_eq!(
        int1.codec.decode_registers(&[51234]).ok().as_deref(),
        Some("51234")
    );
    let int2 = point(
        serde_json::json!({"register": "InputRegister", "offset": 0, "limit": 2}),
        "INT",
    );
    assert_eq!(
        int2.codec
            .decode_registers(&[0xFFFF, 0xFFFE])
            .ok()
            .as_deref(),
        Some("4294967294")
    );
    let scaled = point(
        serde_json::json!({"register": "HoldingRegister", "offset": 0, "limit": 1, "scale": 0.1}),
        "FLOAT",
    );
    assert_eq!(
        scaled.codec.decode_registers(&[60000]).ok().as_deref(),
        Some("6000")
    );
    // An explicit dataType still decides.
    let signed = point(
        serde_json::json!({"register": "HoldingRegister", "offset": 0, "limit": 1, "dataType": "int16"}),
        "INT",
    );
    assert_eq!(
        signed.codec.decode_registers(&[51234]).ok().as_deref(),
        Some("-14302")
    );
}

/// Transport errors say what failed, in words, besides the system's text.
#[test]
fn transport_errors_say_what_failed() {
    let eagain = ModbusError::Transport(tokio_modbus::Error::Transport(
        std::io::Error::from_raw_os_error(11),
    ));
    let text = eagain.to_string();
    assert!(
        text.contains("nothing to read or write") && text.contains("os error 11"),
        "{text}"
    );
    let inprogress = ModbusError::Transport(tokio_modbus::Error::Transport(
        std::io::Error::from_raw_os_error(115),
    ));
    let text = inprogress.to_string();
    assert!(
        text.contains("not made yet") && text.contains("os error 115"),
        "{text}"
    );
    assert!(!text.starts_with("transport:"), "{text}");
}
