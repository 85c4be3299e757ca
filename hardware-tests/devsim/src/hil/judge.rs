//! Whether a step's expectation holds: a value as the device holds it (within the tolerance,
//! by the property's type), the writes the simulator saw on the wire, and none where none may
//! be.

use super::*;

/// Whether `got` (as read) is `want` (as expected) for a property of the model's type `kind`:
/// integers exactly, as 128-bit numbers (every 64-bit value, signed or not; within `tolerance`
/// if one is given), floats within `tolerance`, booleans by their word, strings and bytes as
/// the same text. Without a type, what both read as decides, integers first.
pub fn same(got: &str, want: &Value, tolerance: f64, kind: Option<PropertyType>) -> bool {
    let want = text(want);
    let (g, w) = (got.trim(), want.trim());
    let int = || match (g.parse::<i128>(), w.parse::<i128>()) {
        (Ok(a), Ok(b)) => Some((a.abs_diff(b) as f64) <= tolerance),
        _ => None,
    };
    // A float says nothing about integers beyond 2^53: those are compared as integers or not
    // at all.
    let exact = 9_007_199_254_740_992.0;
    let float = |limit: f64| match (g.parse::<f64>(), w.parse::<f64>()) {
        (Ok(a), Ok(b)) if a.abs() < limit && b.abs() < limit => Some((a - b).abs() <= tolerance),
        _ => None,
    };
    match kind {
        Some(PropertyType::Int) => int().or_else(|| float(exact)).unwrap_or(false),
        Some(PropertyType::Float | PropertyType::Double) => float(f64::INFINITY).unwrap_or(g == w),
        Some(PropertyType::Boolean) => g.eq_ignore_ascii_case(w),
        Some(PropertyType::String | PropertyType::Bytes | PropertyType::Stream) => got == want,
        None => int()
            .or_else(|| float(f64::INFINITY))
            .unwrap_or(got == want),
    }
}

/// What of `e` the twin (and the simulator) does not show now, one text per expectation.
pub(super) fn wrong_now(
    client: &kectl::twin::Client,
    e: &Expect,
    id: &str,
    point: Option<(&Served, &crate::device::SimPoint)>,
) -> (Vec<String>, bool) {
    let (ns, name) = id.split_once('/').unwrap_or(("default", id));
    let tolerance = e.tolerance.unwrap_or(0.0);
    let prop = e.property.as_deref().unwrap_or_default();
    let kind = point.and_then(|(_, p)| p.kind);
    let twin = client.get(ns, name).ok();
    let mut wrong = Vec::new();
    if let Some(want) = &e.reported {
        let got = twin
            .as_ref()
            .and_then(|t| t["properties"][prop]["reported"]["value"].as_str())
            .map(str::to_string);
        if !got
            .as_deref()
            .is_some_and(|g| same(g, want, tolerance, kind))
        {
            wrong.push(format!(
                "{prop} reported {}{}, the twin shows {}",
                text(want),
                if tolerance > 0.0 {
                    format!(" ± {tolerance}")
                } else {
                    String::new()
                },
                got.unwrap_or_else(|| "nothing".into())
            ));
        }
    }
    if let Some(want) = &e.on_device {
        let got = point.and_then(|(s, p)| s.sim.edit(|st| value_of(st, p)));
        if !got
            .as_deref()
            .is_some_and(|g| same(g, want, tolerance, kind))
        {
            wrong.push(format!(
                "{prop} = {} on the device, it holds {}",
                text(want),
                got.unwrap_or_else(|| "nothing (no such simulated property)".into())
            ));
        }
    }
    for (field, want, what) in [
        ("error", &e.error, "an error"),
        ("writeError", &e.refused, "a refused write"),
    ] {
        let Some(want) = want else { continue };
        let got = twin
            .as_ref()
            .and_then(|t| t["properties"][prop][field]["message"].as_str())
            .map(str::to_string);
        if !got.as_deref().is_some_and(|g| g.contains(want.as_str())) {
            wrong.push(format!(
                "{prop} with {what} saying {want:?}, the twin shows {}",
                got.map_or_else(|| "none".to_string(), |g| format!("{g:?}"))
            ));
        }
    }
    let state = twin
        .as_ref()
        .and_then(|t| t["state"].as_str())
        .unwrap_or_default()
        .to_string();
    let reason = twin
        .as_ref()
        .and_then(|t| t["stateReason"].as_str())
        .unwrap_or_default()
        .to_string();
    if let Some(want) = &e.state
        && &state != want
    {
        wrong.push(format!("state {want}, the twin shows {state:?} ({reason})"));
    }
    if let Some(want) = &e.reason
        && !reason.contains(want.as_str())
    {
        wrong.push(format!("a reason with {want:?}, the twin shows {reason:?}"));
    }
    (wrong, twin.is_some())
}

/// Polls the twin (and the simulator) until `e` holds or its time is up; then, with `notBefore`,
/// it must not have held sooner, and with `stays`, it must go on holding that long. `None` when
/// all of it held.
pub(super) fn expect(
    client: &kectl::twin::Client,
    served: &[Served],
    e: &Expect,
    since: Instant,
) -> Option<String> {
    let id = device_id(&e.device);
    let within = Duration::from_secs_f64(e.within.unwrap_or(30.0).max(0.0));
    let started = Instant::now();
    let deadline = started + within;
    let prop = e.property.as_deref().unwrap_or_default();
    let point = served
        .iter()
        .find(|s| s.id == id)
        .and_then(|s| Some((s, s.device.points.iter().find(|p| p.name == prop)?)));
    loop {
        let (mut wrong, found) = wrong_now(client, e, &id, point);
        if let Some(w) = &e.written {
            wrong.extend(not_written(served, &id, w, since));
        }
        if wrong.is_empty() {
            let held = started.elapsed();
            if let Some(nb) = e.not_before
                && held < Duration::from_secs_f64(nb)
            {
                return Some(format!(
                    "it held after {:.1} s, before the {nb} s it must not hold sooner",
                    held.as_secs_f64()
                ));
            }
            // Without `stays`, it held: `None`.
            let stays = e.stays?;
            let until = Instant::now() + Duration::from_secs_f64(stays.max(0.0));
            let since = Instant::now();
            while Instant::now() < until {
                if let Some(why) = pause_unless_stopped(Duration::from_millis(100)) {
                    return Some(why);
                }
                let (wrong, _) = wrong_now(client, e, &id, point);
                if !wrong.is_empty() {
                    return Some(format!(
                        "it held, then stopped after {:.1} s of the {stays} s it must stay: {}",
                        since.elapsed().as_secs_f64(),
                        wrong.join("; ")
                    ));
                }
            }
            return None;
        }
        if Instant::now() >= deadline {
            let mut wrong = wrong;
            if !found {
                wrong.push(format!("edgecore has no device {id}"));
            }
            return Some(format!(
                "after {:.0} s: expected {}",
                within.as_secs_f64(),
                wrong.join("; ")
            ));
        }
        if let Some(why) = pause_unless_stopped(Duration::from_millis(100)) {
            return Some(why);
        }
    }
}

/// The write requests that reached the unit of device `id` since `since`.
pub(super) fn writes_since(
    served: &[Served],
    id: &str,
    since: Instant,
) -> Vec<sim::modbus_sim::WireWrite> {
    served
        .iter()
        .find(|s| s.id == id)
        .map(|s| {
            s.sim
                .edit(|st| st.wire.iter().filter(|w| w.at >= since).cloned().collect())
        })
        .unwrap_or_default()
}

/// Why no write like `w` is seen since `since`, naming what did reach the device.
pub(super) fn not_written(served: &[Served], id: &str, w: &Wire, since: Instant) -> Option<String> {
    let got = writes_since(served, id, since);
    if got.iter().any(|g| w.matches(g)) {
        return None;
    }
    let seen: Vec<String> = got.iter().map(ToString::to_string).collect();
    Some(format!(
        "a write of {w} on the wire, the device got {}",
        if seen.is_empty() {
            "no write".to_string()
        } else {
            seen.join(", ")
        }
    ))
}

/// Watches the wire of `e.device` from `since` for `secs`: `None` when no write request
/// reached it.
pub(super) fn no_write(served: &[Served], e: &Expect, secs: f64, since: Instant) -> Option<String> {
    let id = device_id(&e.device);
    let until = since + Duration::from_secs_f64(secs.max(0.0));
    loop {
        if let Some(first) = writes_since(served, &id, since).first() {
            return Some(format!(
                "no write for {secs} s, but {:.1} s in the device got {first}",
                first.at.duration_since(since).as_secs_f64()
            ));
        }
        if Instant::now() >= until {
            return None;
        }
        if let Some(why) = pause_unless_stopped(Duration::from_millis(100)) {
            return Some(why);
        }
    }
}
