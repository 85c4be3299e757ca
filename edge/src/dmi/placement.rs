//! Which mapper serves which device: the placement policy of [`super::mappers`] as pure code over
//! a snapshot of the mappers (protocol, alive, devices), so that each rule is a unit test. The
//! manager in `mappers.rs` takes the decisions from here and carries them out with DMI calls,
//! persisting what changed.
//!
//! The rules:
//! - A device pinned by its annotation goes to that mapper only (waiting for it while it is down).
//! - A new device goes to the live mapper of its protocol that ranks best for it (rendezvous
//!   hashing, [`score`]) among those holding less than an even share; if all are full, the least
//!   loaded.
//! - A mapper that joins (registers, or answers again) takes back the devices that left it and
//!   still fit it, then, while it holds fewer than its share, the devices that rank it best from
//!   the most loaded live mapper of its protocol. Nothing else moves.
//! - The devices of a mapper found unreachable go to the other live mappers of their protocol,
//!   except those pinned to it.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

/// The rank of `mapper` for `device` in rendezvous hashing: FNV-1a of both names, finished with
/// splitmix64 so that similar names spread. Stable across processes and releases (the standard
/// library's hasher is not promised to be).
pub(super) fn score(mapper: &str, device: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in mapper.bytes().chain([0u8]).chain(device.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// What placement needs to know of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct DeviceFacts {
    /// `namespace/name`.
    pub id: String,
    pub protocol: Option<String>,
    /// The mapper its annotation pins it to.
    pub pin: Option<String>,
}

/// What placement needs to know of a mapper.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct MapperView<'a> {
    pub protocol: String,
    pub alive: bool,
    /// Devices assigned to it (`namespace/name`).
    pub devices: Cow<'a, BTreeSet<String>>,
}

/// A device going from one mapper (or none) to another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Move {
    pub device: String,
    pub from: Option<String>,
    pub to: String,
}

/// Where a device of an unreachable mapper goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Failover {
    /// It is pinned to that mapper and waits for it.
    Pinned,
    MoveTo(String),
    /// No other live mapper of its protocol.
    Nowhere,
}

/// The mappers, by name: a snapshot the decisions are taken on, kept in step as moves are made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Placement<'a> {
    pub mappers: BTreeMap<String, MapperView<'a>>,
}

impl Placement<'_> {
    pub(super) fn owner(&self, id: &str) -> Option<&str> {
        self.mappers
            .iter()
            .find(|(_, m)| m.devices.contains(id))
            .map(|(n, _)| n.as_str())
    }

    #[cfg(test)]
    pub(super) fn set_alive(&mut self, name: &str, alive: bool) {
        if let Some(m) = self.mappers.get_mut(name) {
            m.alive = alive;
        }
    }

    /// Whether `mapper` may serve `device`: the one it is pinned to, or else one of its
    /// protocol.
    pub(super) fn fits(&self, device: &DeviceFacts, mapper: &str) -> bool {
        match &device.pin {
            Some(p) => p == mapper,
            None => {
                self.mappers.get(mapper).map(|m| m.protocol.as_str()) == device.protocol.as_deref()
            }
        }
    }

    /// The mapper a device that has none (or must leave its own, `except`) should go to: the one
    /// its annotation names (live or not: it waits for it), else the best-ranked live mapper of
    /// its protocol that has room, else the least loaded one.
    pub(super) fn choose(&self, device: &DeviceFacts, except: Option<&str>) -> Option<String> {
        if let Some(m) = &device.pin {
            return self.mappers.contains_key(m).then(|| m.clone());
        }
        let protocol = device.protocol.as_deref()?;
        let id = device.id.as_str();
        let live: Vec<(&String, &MapperView<'_>)> = self
            .mappers
            .iter()
            .filter(|(n, m)| m.alive && m.protocol == protocol && Some(n.as_str()) != except)
            .collect();
        if live.is_empty() {
            return None;
        }
        let total: usize = self
            .mappers
            .values()
            .filter(|m| m.protocol == protocol)
            .map(|m| m.devices.len())
            .sum::<usize>()
            + usize::from(self.owner(id).is_none());
        let cap = total.div_ceil(live.len());
        let load = |m: &MapperView| m.devices.iter().filter(|d| *d != id).count();
        live.iter()
            .filter(|(_, m)| load(m) < cap)
            .max_by_key(|(n, _)| score(n, id))
            .or_else(|| live.iter().min_by_key(|(_, m)| load(m)))
            .map(|(n, _)| (*n).clone())
    }

    /// Makes a move in the snapshot.
    pub(super) fn apply(&mut self, m: &Move) {
        if let Some(from) = m.from.as_deref().filter(|f| *f != m.to)
            && let Some(v) = self.mappers.get_mut(from)
        {
            v.devices.to_mut().remove(&m.device);
        }
        if let Some(v) = self.mappers.get_mut(&m.to) {
            v.devices.to_mut().insert(m.device.clone());
        }
    }

    /// What a mapper that registers claims: what it had before (`previous`, if it was of the
    /// same protocol), the devices pinned to it, and the devices of its protocol that no mapper
    /// has.
    pub(super) fn claims_on_register(
        &self,
        name: &str,
        previous: BTreeSet<String>,
        devices: &BTreeMap<String, DeviceFacts>,
    ) -> BTreeSet<String> {
        let Some(protocol) = self.mappers.get(name).map(|m| m.protocol.as_str()) else {
            return BTreeSet::new();
        };
        let mut claims = previous;
        for d in devices.values() {
            let unowned = d.pin.is_none()
                && d.protocol.as_deref() == Some(protocol)
                && self.owner(&d.id).is_none();
            if d.pin.as_deref() == Some(name) || unowned {
                claims.insert(d.id.clone());
            }
        }
        claims
    }

    /// The moves that let `name` join: it takes back what it `reclaim`s (when the device still
    /// exists and fits it), then, while it holds fewer than its share of its protocol's devices
    /// on live mappers, the unpinned device that ranks it best from the most loaded other live
    /// mapper (ties: the first by name), as long as that one holds at least two more than it.
    /// The moves are made in the snapshot as they are decided.
    pub(super) fn join(
        &mut self,
        name: &str,
        reclaim: &BTreeSet<String>,
        devices: &BTreeMap<String, DeviceFacts>,
    ) -> Vec<Move> {
        let Some(protocol) = self.mappers.get(name).map(|m| m.protocol.clone()) else {
            return Vec::new();
        };
        let mut moves = Vec::new();
        for key in reclaim {
            let Some(device) = devices.get(key) else {
                continue;
            };
            let from = self.owner(key).map(str::to_string);
            if self.fits(device, name) && from.as_deref() != Some(name) {
                let m = Move {
                    device: key.clone(),
                    from,
                    to: name.to_string(),
                };
                self.apply(&m);
                moves.push(m);
            }
        }
        loop {
            let loads: Vec<(String, usize)> = self
                .mappers
                .iter()
                .filter(|(_, m)| m.alive && m.protocol == protocol)
                .map(|(n, m)| (n.clone(), m.devices.len()))
                .collect();
            let total: usize = loads.iter().map(|(_, l)| l).sum();
            let mine = loads.iter().find(|(m, _)| m == name).map_or(0, |(_, l)| *l);
            if loads.is_empty() || mine >= total / loads.len() {
                break;
            }
            let Some((donor, load)) = loads
                .iter()
                .filter(|(m, _)| m != name)
                .max_by_key(|(m, l)| (*l, std::cmp::Reverse(m.clone())))
                .cloned()
            else {
                break;
            };
            if load <= mine + 1 {
                break;
            }
            let best = self.mappers.get(&donor).and_then(|m| {
                m.devices
                    .iter()
                    .filter(|k| devices.get(*k).is_some_and(|d| d.pin.is_none()))
                    .max_by_key(|k| score(name, k))
                    .cloned()
            });
            let Some(device) = best else {
                break;
            };
            let m = Move {
                device,
                from: Some(donor),
                to: name.to_string(),
            };
            self.apply(&m);
            moves.push(m);
        }
        moves
    }

    /// Where `device`, served by the unreachable mapper `name`, goes.
    pub(super) fn failover(&self, name: &str, device: &DeviceFacts) -> Failover {
        if device.pin.as_deref() == Some(name) {
            return Failover::Pinned;
        }
        match self.choose(device, Some(name)) {
            Some(to) => Failover::MoveTo(to),
            None => Failover::Nowhere,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(id: &str, protocol: &str) -> DeviceFacts {
        DeviceFacts {
            id: id.into(),
            protocol: Some(protocol.into()),
            pin: None,
        }
    }

    fn pinned(id: &str, protocol: &str, to: &str) -> DeviceFacts {
        DeviceFacts {
            pin: Some(to.into()),
            ..device(id, protocol)
        }
    }

    fn catalog(devices: &[DeviceFacts]) -> BTreeMap<String, DeviceFacts> {
        devices.iter().map(|d| (d.id.clone(), d.clone())).collect()
    }

    fn mapper(protocol: &str, devices: &[&str]) -> MapperView<'static> {
        MapperView {
            protocol: protocol.into(),
            alive: true,
            devices: Cow::Owned(devices.iter().map(|d| d.to_string()).collect()),
        }
    }

    fn placement(mappers: &[(&str, MapperView<'static>)]) -> Placement<'static> {
        Placement {
            mappers: mappers
                .iter()
                .map(|(n, m)| (n.to_string(), m.clone()))
                .collect(),
        }
    }

    /// Places `devices` one after another as new devices, as the manager does.
    fn place_all(p: &mut Placement, devices: &[DeviceFacts]) {
        for d in devices {
            if let Some(to) = p.choose(d, None) {
                p.apply(&Move {
                    device: d.id.clone(),
                    from: None,
                    to,
                });
            }
        }
    }

    fn loads(p: &Placement) -> Vec<usize> {
        p.mappers.values().map(|m| m.devices.len()).collect()
    }

    #[test]
    fn scores_are_stable() {
        // A fixed value (FNV-1a + splitmix64, computed apart): an assignment must not change with
        // the compiler or the process.
        assert_eq!(score("a", "b"), score("a", "b"));
        assert_ne!(score("a", "b"), score("b", "a"));
        assert_eq!(
            score("modbus-mapper-a", "default/dev-0"),
            0xd996_238f_5aa4_5f89
        );
    }

    #[test]
    fn new_devices_spread_evenly_over_the_live_mappers_of_their_protocol() {
        let mut p = placement(&[
            ("a", mapper("modbus", &[])),
            ("b", mapper("modbus", &[])),
            ("c", mapper("modbus", &[])),
            ("o", mapper("opcua", &[])),
        ]);
        let devices: Vec<_> = (0..30)
            .map(|i| device(&format!("default/d{i}"), "modbus"))
            .collect();
        place_all(&mut p, &devices);
        assert_eq!(loads(&p), [10, 10, 10, 0]);
    }

    #[test]
    fn a_device_goes_nowhere_without_a_live_mapper_of_its_protocol() {
        let mut p = placement(&[("a", mapper("modbus", &[]))]);
        assert_eq!(p.choose(&device("default/x", "opcua"), None), None);
        p.set_alive("a", false);
        assert_eq!(p.choose(&device("default/x", "modbus"), None), None);
        let no_protocol = DeviceFacts {
            protocol: None,
            ..device("default/x", "modbus")
        };
        assert_eq!(p.choose(&no_protocol, None), None);
    }

    #[test]
    fn a_pinned_device_goes_to_its_mapper_even_while_it_is_down_and_never_elsewhere() {
        let mut p = placement(&[("a", mapper("modbus", &[])), ("b", mapper("modbus", &[]))]);
        p.set_alive("b", false);
        let d = pinned("default/x", "modbus", "b");
        assert_eq!(p.choose(&d, None), Some("b".into()));
        assert_eq!(p.failover("b", &d), Failover::Pinned);
        // Pinned to a mapper that never registered: it waits, unplaced.
        assert_eq!(p.choose(&pinned("default/y", "modbus", "z"), None), None);
    }

    #[test]
    fn an_unreachable_mappers_devices_go_to_the_other_live_mappers_of_the_protocol() {
        let p = placement(&[
            ("a", mapper("modbus", &["default/x"])),
            ("b", mapper("modbus", &[])),
            ("o", mapper("opcua", &[])),
        ]);
        assert_eq!(
            p.failover("a", &device("default/x", "modbus")),
            Failover::MoveTo("b".into())
        );
        let alone = placement(&[("a", mapper("modbus", &["default/x"]))]);
        assert_eq!(
            alone.failover("a", &device("default/x", "modbus")),
            Failover::Nowhere
        );
    }

    #[test]
    fn a_restart_moves_only_the_restarted_mappers_own_devices_away_and_back() {
        let devices: Vec<_> = (0..20)
            .map(|i| device(&format!("default/d{i}"), "modbus"))
            .collect();
        let facts = catalog(&devices);
        let mut p = placement(&[
            ("a", mapper("modbus", &[])),
            ("b", mapper("modbus", &[])),
            ("c", mapper("modbus", &[])),
        ]);
        place_all(&mut p, &devices);
        let before = p.clone();
        let own_a = before.mappers["a"].devices.clone().into_owned();
        // a goes down: its devices fail over, one by one, to b and c.
        p.set_alive("a", false);
        for id in &own_a {
            let Failover::MoveTo(to) = p.failover("a", &facts[id]) else {
                panic!("{id} has nowhere to go");
            };
            assert_ne!(to, "a");
            p.apply(&Move {
                device: id.clone(),
                from: Some("a".into()),
                to,
            });
        }
        assert!(p.mappers["a"].devices.is_empty());
        // b and c kept their own devices throughout.
        for m in ["b", "c"] {
            assert!(before.mappers[m].devices.is_subset(&p.mappers[m].devices));
        }
        // a answers again and takes back exactly what left it: the start is restored.
        p.set_alive("a", true);
        let moves = p.join("a", &own_a, &facts);
        assert!(
            moves
                .iter()
                .all(|m| m.to == "a" && own_a.contains(&m.device))
        );
        assert_eq!(p, before);
    }

    #[test]
    fn a_new_mapper_takes_its_share_from_the_most_loaded_and_nothing_else_moves() {
        let devices: Vec<_> = (0..12)
            .map(|i| device(&format!("default/d{i}"), "modbus"))
            .collect();
        let facts = catalog(&devices);
        let mut p = placement(&[("a", mapper("modbus", &[])), ("b", mapper("modbus", &[]))]);
        place_all(&mut p, &devices);
        assert_eq!(loads(&p), [6, 6]);
        p.mappers.insert("c".into(), mapper("modbus", &[]));
        let claims = p.claims_on_register("c", BTreeSet::new(), &facts);
        assert!(claims.is_empty(), "every device has a mapper: {claims:?}");
        let moves = p.join("c", &claims, &facts);
        assert_eq!(loads(&p), [4, 4, 4]);
        assert_eq!(moves.len(), 4, "{moves:?}");
        assert!(moves.iter().all(|m| m.to == "c"));
    }

    #[test]
    fn a_pinned_device_is_never_taken_for_balance() {
        let devices = [
            pinned("default/p1", "modbus", "a"),
            pinned("default/p2", "modbus", "a"),
            pinned("default/p3", "modbus", "a"),
            pinned("default/p4", "modbus", "a"),
        ];
        let facts = catalog(&devices);
        let mut p = placement(&[
            (
                "a",
                mapper(
                    "modbus",
                    &["default/p1", "default/p2", "default/p3", "default/p4"],
                ),
            ),
            ("b", mapper("modbus", &[])),
        ]);
        assert!(p.join("b", &BTreeSet::new(), &facts).is_empty());
        assert_eq!(loads(&p), [4, 0]);
    }

    #[test]
    fn a_registering_mapper_claims_its_pinned_and_its_protocols_unowned_devices() {
        let facts = catalog(&[
            pinned("default/mine", "modbus", "a"),
            pinned("default/theirs", "modbus", "b"),
            device("default/free", "modbus"),
            device("default/held", "modbus"),
            device("default/other", "opcua"),
        ]);
        let p = placement(&[
            ("a", mapper("modbus", &[])),
            ("b", mapper("modbus", &["default/held"])),
        ]);
        let before: BTreeSet<String> = ["default/gone".to_string()].into();
        let claims = p.claims_on_register("a", before, &facts);
        let want: BTreeSet<String> = ["default/free", "default/gone", "default/mine"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(claims, want);
    }

    #[test]
    fn a_reclaimed_device_that_no_longer_fits_stays_where_it_is() {
        let facts = catalog(&[
            device("default/now-opcua", "opcua"),
            pinned("default/pinned-away", "modbus", "b"),
        ]);
        let mut p = placement(&[
            ("a", mapper("modbus", &[])),
            ("b", mapper("modbus", &["default/pinned-away"])),
            ("o", mapper("opcua", &["default/now-opcua"])),
        ]);
        let reclaim: BTreeSet<String> = facts.keys().cloned().collect();
        let reclaim = reclaim
            .into_iter()
            .chain(["default/deleted".to_string()])
            .collect();
        assert!(p.join("a", &reclaim, &facts).is_empty());
    }
}
