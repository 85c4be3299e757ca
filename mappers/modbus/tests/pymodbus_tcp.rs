//! The Modbus device driver against pymodbus, a Modbus TCP server the project did not write
//! (`hardware-tests/sims/modbus_server.py`, started by each test). Needs `python3` with
//! `pymodbus` (`.ci/run` installs it).

use mapper_modbus::device::{Connection, Device, ModbusError, ModelHints, Point};
use serde_json::{Value, json};
use sim::{PyModbus, free_port, object};

/// The simulator on a free port.
fn sim() -> PyModbus {
    PyModbus::start(free_port())
}

fn point(name: &str, visitor: Value) -> Point {
    Point::from_config(name, &object(visitor), &ModelHints::default()).expect("valid visitor")
}

fn device(port: u16, points: Vec<Point>) -> Device {
    // KubeEdge's key spellings, numbers as strings where the examples use them.
    let c = Connection::from_config(&object(
        json!({"ip": "127.0.0.1", "port": port.to_string(), "SlaveID": 1, "timeout": 2000}),
    ))
    .expect("valid protocol config");
    Device::new(c, points)
}

async fn read_all(d: &mut Device) -> Vec<(String, Result<String, String>)> {
    let due: Vec<usize> = (0..d.points.len()).collect();
    let mut out: Vec<(String, Result<String, String>)> = d
        .read(&due)
        .await
        .into_iter()
        .map(|(i, r)| {
            (
                d.points[i].name.clone(),
                r.map(|t| t.to_string()).map_err(|e| e.to_string()),
            )
        })
        .collect();
    out.sort();
    out
}

fn ok(name: &str, v: &str) -> (String, Result<String, String>) {
    (name.to_string(), Ok(v.to_string()))
}

#[tokio::test]
async fn typed_values_come_back_from_few_merged_requests() {
    let sim = sim();
    let mut d = device(
        sim.port,
        vec![
            point(
                "temp",
                json!({"register": "HoldingRegister", "offset": 0, "dataType": "uint16", "scale": 0.1, "valueOffset": -40}),
            ),
            point(
                "abcd",
                json!({"register": "HoldingRegister", "offset": "1", "dataType": "float32"}),
            ),
            point(
                "cdab",
                json!({"Register": "HoldingRegister", "Offset": 3, "DataType": "float32", "IsRegisterSwap": "true"}),
            ),
            point(
                "neg",
                json!({"register": "HoldingRegister", "offset": 5, "dataType": "int16"}),
            ),
            point(
                "name",
                json!({"register": "HoldingRegister", "offset": 10, "limit": 4, "dataType": "string"}),
            ),
            point("c0", json!({"register": "CoilRegister", "offset": 0})),
            point("c1", json!({"register": "CoilRegister", "offset": 1})),
            point(
                "scratch",
                json!({"register": "HoldingRegister", "offset": 30, "dataType": "int16"}),
            ),
        ],
    );
    assert_eq!(
        read_all(&mut d).await,
        vec![
            ok("abcd", "123.456"),
            ok("c0", "true"),
            ok("c1", "false"),
            ok("cdab", "123.456"),
            ok("name", "PLC-7"),
            ok("neg", "-2"),
            ok("scratch", "30"),
            ok("temp", "25"),
        ]
    );
    // Registers 0-13 in one request (the hole 6-9 is filled), 30 on its own, the coils in one:
    // three requests for eight properties, where KubeEdge's mapper sends eight.
    assert_eq!(d.requests(), 3);
}

#[tokio::test]
async fn an_exception_fails_only_its_property_and_a_refused_hole_is_split() {
    let sim = sim();
    let mut d = device(
        sim.port,
        vec![
            point("a", json!({"register": "HoldingRegister", "offset": 20})),
            point(
                "missing",
                json!({"register": "HoldingRegister", "offset": 25}),
            ),
            point("b", json!({"register": "HoldingRegister", "offset": 30})),
        ],
    );
    let got = read_all(&mut d).await;
    assert_eq!(got[0], ok("a", "0"));
    assert_eq!(got[1], ok("b", "30"));
    assert_eq!(got[2].0, "missing");
    let err = got[2].1.as_ref().expect_err("register 25 does not exist");
    assert!(err.contains("exception"), "{err}");
    // The merged request 20-30 was refused and split; from now on the holes are not bridged,
    // so the next cycle costs three requests and no refused one.
    let before = d.requests();
    let again = read_all(&mut d).await;
    assert_eq!(again, got);
    assert_eq!(d.requests() - before, 3);
}

#[tokio::test]
async fn writes_land_and_read_back_and_bad_values_never_reach_the_wire() {
    let sim = sim();
    let mut d = device(
        sim.port,
        vec![
            point(
                "set",
                json!({"register": "HoldingRegister", "offset": 31, "dataType": "int16"}),
            ),
            point(
                "f",
                json!({"register": "HoldingRegister", "offset": 32, "dataType": "float32", "byteOrder": "CDAB"}),
            ),
            point("coil", json!({"register": "CoilRegister", "offset": 1})),
            point("ro", json!({"register": "InputRegister", "offset": 0})),
        ],
    );
    d.write(0, "1234").await.expect("single register");
    d.write(1, "-7.5").await.expect("two registers");
    d.write(2, "true").await.expect("coil");
    let got = read_all(&mut d).await;
    assert!(got.contains(&ok("set", "1234")), "{got:?}");
    assert!(got.contains(&ok("f", "-7.5")), "{got:?}");
    assert!(got.contains(&ok("coil", "true")), "{got:?}");

    let sent = d.requests();
    assert!(matches!(
        d.write(0, "40000").await,
        Err(ModbusError::Codec(_))
    ));
    assert!(matches!(
        d.write(0, "warm").await,
        Err(ModbusError::Codec(_))
    ));
    assert!(matches!(
        d.write(3, "1").await,
        Err(ModbusError::ReadOnly(_))
    ));
    assert_eq!(d.requests(), sent, "nothing was sent");
}

#[tokio::test]
async fn a_dead_server_is_a_link_error_and_the_device_reconnects() {
    let sim = sim();
    let port = sim.port;
    let mut d = device(
        port,
        vec![point(
            "b",
            json!({"register": "HoldingRegister", "offset": 30}),
        )],
    );
    assert_eq!(read_all(&mut d).await, vec![ok("b", "30")]);
    drop(sim);
    let (_, r) = d.read(&[0]).await.pop().expect("one result");
    let e = r.expect_err("the server is gone");
    assert!(e.is_link(), "{e}");
    let _sim = PyModbus::start(port);
    assert_eq!(read_all(&mut d).await, vec![ok("b", "30")]);
}

#[test]
fn bad_configuration_names_the_key() {
    let e = Point::from_config(
        "x",
        &object(json!({"register": "Holding", "offset": 1, "dataType": "int128"})),
        &ModelHints::default(),
    )
    .expect_err("unknown type");
    assert_eq!(e.key, "dataType");
    let e = Point::from_config(
        "x",
        &object(json!({"register": "Magic", "offset": 1})),
        &ModelHints::default(),
    )
    .expect_err("unknown table");
    assert_eq!(e.key, "register");
    let e = Point::from_config(
        "x",
        &object(json!({"register": "HoldingRegister", "offset": "ten"})),
        &ModelHints::default(),
    )
    .expect_err("not a number");
    assert_eq!(e.key, "offset");
    let e = Point::from_config(
        "x",
        &object(
            json!({"register": "HoldingRegister", "offset": 1, "dataType": "float32", "limit": 3}),
        ),
        &ModelHints::default(),
    )
    .expect_err("wrong size");
    assert_eq!(e.key, "limit");
    let e = Connection::from_config(&object(json!({"port": 502}))).expect_err("no address");
    assert_eq!(e.key, "ip");
    let e = Connection::from_config(&object(
        json!({"serialPort": "/dev/ttyS0", "parity": "mark"}),
    ))
    .expect_err("parity");
    assert_eq!(e.key, "parity");
    // The model's type picks the data type when the visitor names none.
    let p = Point::from_config(
        "t",
        &object(json!({"register": "HoldingRegister", "offset": 0})),
        &ModelHints {
            value_type: Some("FLOAT".into()),
            ..ModelHints::default()
        },
    )
    .expect("valid");
    assert_eq!(p.read.count, 2);
}
