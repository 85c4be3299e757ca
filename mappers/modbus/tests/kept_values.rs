//! The driver keeps each property's last value and the plan of its last read, and hands the same
//! value back while a property's registers do not change. What must hold whatever the sequence:
//! each read gives every property the value of its own registers as they are now, never one
//! kept from before they changed, never another property's; whichever properties are due
//! together, and after a merged request is refused and the plan is made again.
//!
//! A seeded generator (`KEPT_SEED` to repeat a run; printed) changes some registers of the
//! simulator between reads (or none), picks the properties due, and at one point takes away an
//! address between two properties that a merged request bridges.

use mapper_modbus::device::{Connection, Device, ModelHints, Point};
use serde_json::{Value, json};
use sim::modbus_sim::Sim;
use sim::object;
use sim::rng::Rng;
use std::collections::BTreeMap;

/// The properties: name, visitor. Holding registers 0..=11 and coils 0..=1, adjacent or a few
/// apart, so that a read merges them.
fn visitors() -> Vec<(&'static str, Value)> {
    vec![
        (
            "i16",
            json!({"register": "HoldingRegister", "offset": 0, "dataType": "int16"}),
        ),
        (
            "u16",
            json!({"register": "HoldingRegister", "offset": 1, "dataType": "uint16"}),
        ),
        (
            "f32",
            json!({"register": "HoldingRegister", "offset": 2, "dataType": "float32"}),
        ),
        (
            "text",
            json!({"register": "HoldingRegister", "offset": 4, "limit": 2, "dataType": "string"}),
        ),
        (
            "i32x",
            json!({"register": "HoldingRegister", "offset": 6, "dataType": "int32", "scale": 0.1}),
        ),
        (
            "far",
            json!({"register": "HoldingRegister", "offset": 11, "dataType": "int16"}),
        ),
        (
            "bit3",
            json!({"register": "HoldingRegister", "offset": 0, "dataType": "boolean", "bit": 3}),
        ),
        ("c0", json!({"register": "CoilRegister", "offset": 0})),
        ("c1", json!({"register": "CoilRegister", "offset": 1})),
    ]
}

/// What each property must read, from the registers as the test set them (decoded here on
/// its own, not by the driver's codec).
fn expected(holding: &BTreeMap<u16, u16>, coils: &BTreeMap<u16, bool>) -> Vec<String> {
    let h = |a: u16| holding[&a];
    let f = f32::from_bits((u32::from(h(2)) << 16) | u32::from(h(3)));
    let text: String = [h(4), h(5)]
        .iter()
        .flat_map(|w| w.to_be_bytes())
        .map(char::from)
        .collect();
    let i32x = (i32::from(h(6) as i16) << 16) | i32::from(h(7));
    let tenths = format!("{:.1}", f64::from(i32x) / 10.0);
    let tenths = tenths
        .trim_end_matches('0')
        .trim_end_matches('.')
        .to_string();
    vec![
        (h(0) as i16).to_string(),
        h(1).to_string(),
        f.to_string(),
        text,
        if tenths == "-0" { "0".into() } else { tenths },
        (h(11) as i16).to_string(),
        ((h(0) >> 3) & 1 == 1).to_string(),
        coils[&0].to_string(),
        coils[&1].to_string(),
    ]
}

/// A new value for holding register `a`, in the shape its property reads.
fn draw(rng: &mut Rng, a: u16) -> u16 {
    match a {
        // float32 halves of k + 0.5 (exact in binary), k in -500..500.
        2 | 3 => 0,
        // Two ASCII letters.
        4 | 5 => {
            let c = |r: &mut Rng| b'A' + r.below(26) as u8;
            u16::from_be_bytes([c(rng), c(rng)])
        }
        _ => rng.below(65536) as u16,
    }
}

fn set_float(holding: &mut BTreeMap<u16, u16>, rng: &mut Rng) {
    let v = rng.below(1000) as f32 - 500.0 + 0.5;
    let bits = v.to_bits();
    holding.insert(2, (bits >> 16) as u16);
    holding.insert(3, bits as u16);
}

#[test]
fn kept_values_and_plans_follow_the_registers_whatever_changes_and_is_due() {
    let seed = sim::rng::seed("KEPT_SEED");
    let mut rng = Rng::new(seed);

    let mut holding: BTreeMap<u16, u16> = (0..=11).map(|a| (a, 0)).collect();
    for a in [0, 1, 4, 5, 6, 7, 8, 9, 10, 11] {
        holding.insert(a, draw(&mut rng, a));
    }
    set_float(&mut holding, &mut rng);
    let mut coils: BTreeMap<u16, bool> = [(0, false), (1, true)].into();
    let sim = {
        let (h, c) = (holding.clone(), coils.clone());
        Sim::with(move |s| {
            s.holding = h;
            s.coils = c;
        })
    };
    let (port, _rt) = sim.start("127.0.0.1:0").expect("simulator");

    let config = object(json!({"ip": "127.0.0.1", "port": port, "timeout": 2000}));
    let connection = Connection::from_config(&config).expect("protocol config");
    let points: Vec<Point> = visitors()
        .into_iter()
        .map(|(name, v)| {
            Point::from_config(name, &object(v), &ModelHints::default()).expect("visitor")
        })
        .collect();
    let names: Vec<String> = points.iter().map(|p| p.name.clone()).collect();
    let mut device = Device::new(connection, points);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    let all: Vec<usize> = (0..names.len()).collect();
    let mut due = all.clone();
    let mut kept = 0usize;
    let mut last: BTreeMap<usize, std::sync::Arc<str>> = BTreeMap::new();
    for cycle in 0..400 {
        // Registers change between reads, a few at a time, or none.
        for _ in 0..rng.below(4) {
            match rng.below(13) {
                2 | 3 => set_float(&mut holding, &mut rng),
                12 => {
                    let c = rng.below(2) as u16;
                    let v = coils[&c];
                    coils.insert(c, !v);
                }
                // Once gone, address 9 stays gone.
                9 if cycle >= 200 => {}
                a => {
                    let a = a as u16;
                    holding.insert(a, draw(&mut rng, a));
                }
            }
        }
        // Halfway, the address between `i32x` and `far` goes: the merged read is refused
        // and planned again around it.
        if cycle == 200 {
            holding.remove(&9);
        }
        {
            let (h, c) = (holding.clone(), coils.clone());
            sim.edit(move |s| {
                s.holding = h;
                s.coils = c;
            });
        }
        // The same properties due as last time (the kept plan), or others.
        if rng.below(3) == 0 {
            due = all.iter().copied().filter(|_| rng.below(2) == 0).collect();
        }
        let want = expected(&holding, &coils);
        let results = rt.block_on(device.read(&due));
        let mut got: Vec<usize> = results.iter().map(|(i, _)| *i).collect();
        got.sort_unstable();
        assert_eq!(
            got, due,
            "cycle {cycle} (KEPT_SEED={seed}): one result per due property"
        );
        for (i, r) in results {
            let v =
                r.unwrap_or_else(|e| panic!("cycle {cycle} (KEPT_SEED={seed}): {}: {e}", names[i]));
            assert_eq!(
                &*v, want[i],
                "cycle {cycle} (KEPT_SEED={seed}): {} read a value that is not its registers' now",
                names[i]
            );
            if last.get(&i).is_some_and(|l| std::sync::Arc::ptr_eq(l, &v)) {
                kept += 1;
            }
            last.insert(i, v);
        }
    }
    // The registers mostly stay as they were: most values are handed back as kept.
    assert!(
        kept > 400,
        "only {kept} values were kept (KEPT_SEED={seed})"
    );

    // A kept plan is made again once a merged request was refused: a new device reads
    // everything (registers 0-11 in one request, the coils), address 10 between `i32x` and
    // `far` goes, the merge is refused and split (four requests), and from then on a read of
    // everything is three (registers 0-7, register 11, the coils).
    let mut device = Device::new(
        Connection::from_config(&config).expect("protocol config"),
        visitors()
            .into_iter()
            .map(|(name, v)| {
                Point::from_config(name, &object(v), &ModelHints::default()).expect("visitor")
            })
            .collect(),
    );
    sim.edit(|s| s.holding.insert(9, 0));
    let requests = || sim.requests.load(std::sync::atomic::Ordering::Relaxed);
    let mut counts = Vec::new();
    for round in 0..4 {
        if round == 1 {
            sim.edit(|s| s.holding.remove(&10));
        }
        let before = requests();
        let results = rt.block_on(device.read(&all));
        assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
        counts.push(requests() - before);
    }
    assert_eq!(counts, [2, 4, 3, 3], "requests per read of every property");
}
