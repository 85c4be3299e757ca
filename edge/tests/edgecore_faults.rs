//! An operator's bad day: a manifests directory that vanishes or cannot be listed, too many open
//! files, a full disk. None of them may lose or wipe a twin. The full-disk tests mount a small
//! tmpfs and so need root (CI runs as root); elsewhere they say they were skipped.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const OVEN: &str = "/api/v1/devices/default/oven-1";

fn desired_of(e: &Edgecore, prop: &str) -> Option<String> {
    e.twin("default/oven-1").and_then(|t| desired(&t, prop))
}

fn healthz(e: &Edgecore) -> String {
    e.get("/healthz").1.as_str().unwrap_or_default().to_string()
}

/// Sets `setpoint`'s desired value and checks it was acknowledged.
fn set(e: &Edgecore, value: u32) {
    let (status, body) = e.put(
        &format!("{OVEN}/desired"),
        &format!("{{\"setpoint\": {value}}}"),
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_manifests_dir_that_cannot_be_listed_for_a_while_keeps_every_twin() {
    let e = Edgecore::start(None);
    set(&e, 123);
    let parked = e.dir.path().join("manifests.parked");
    std::fs::rename(&e.manifests, &parked).expect("park the directory");
    // A symlink loop: listing fails with ELOOP, as in the report.
    std::os::unix::fs::symlink(&e.manifests, &e.manifests).expect("symlink loop");
    e.eventually("degraded while the directory cannot be listed", |e| {
        healthz(e)
            .contains("cannot list the manifests directory")
            .then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        desired_of(&e, "setpoint").as_deref(),
        Some("123"),
        "the twin is kept"
    );
    let m = e.get("/metrics").1;
    assert!(
        m.as_str()
            .unwrap_or("")
            .lines()
            .any(|l| l == "edgecore_manifests_unreadable 1"),
        "{m}"
    );
    std::fs::remove_file(&e.manifests).expect("remove the loop");
    std::fs::rename(&parked, &e.manifests).expect("restore the directory");
    e.eventually("healthy again", |e| (healthz(e) == "ok").then_some(()));
    let t = e.twin("default/oven-1").expect("twin");
    assert_eq!(desired(&t, "setpoint").as_deref(), Some("123"));
    assert!(
        t["desiredVersion"].as_u64() >= Some(2),
        "versions kept: {t}"
    );
    assert!(e.log().contains("keeping the last good set of devices"));
}

#[test]
fn a_start_with_the_manifests_dir_missing_deletes_nothing() {
    let mut e = Edgecore::start(None);
    set(&e, 77);
    e.stop(false);
    let parked = e.dir.path().join("manifests.parked");
    std::fs::rename(&e.manifests, &parked).expect("park the directory");
    e.start_again();
    e.wait_ready();
    assert_eq!(desired_of(&e, "setpoint").as_deref(), Some("77"));
    assert!(healthz(&e).starts_with("degraded"), "{}", healthz(&e));
    std::fs::rename(&parked, &e.manifests).expect("restore the directory");
    e.eventually("healthy again", |e| (healthz(e) == "ok").then_some(()));
    assert_eq!(desired_of(&e, "setpoint").as_deref(), Some("77"));
    // The first complete read does remove what the manifests no longer declare.
    std::fs::write(e.manifests.join("oven.yaml"), "").expect("empty manifest");
    e.eventually("the undeclared device removed", |e| {
        e.twin("default/oven-1").is_none().then_some(())
    });
}

/// A first start (no database yet) parses the manifests while its databases are created; a
/// directory that is missing then says so as it does on any start, and its devices come once
/// it is there.
#[test]
fn a_first_start_with_the_manifests_dir_missing_says_so() {
    let mut e = Edgecore::start(None);
    e.stop(false);
    std::fs::remove_dir_all(e.dir.path().join("data")).expect("remove the data directory");
    let parked = e.dir.path().join("manifests.parked");
    std::fs::rename(&e.manifests, &parked).expect("park the directory");
    e.start_again();
    e.wait_ready();
    let health = healthz(&e);
    assert!(
        health.starts_with("degraded") && health.contains("cannot list the manifests directory"),
        "{health}"
    );
    assert!(e.twin("default/oven-1").is_none());
    // The helper that parses a first start's manifests leaves the missing directory to
    // edgecore, which says why: no failure of the helper to report.
    let log = e.log();
    assert!(
        log.contains("cannot list the manifests directory") && !log.contains("helper"),
        "{log}"
    );
    std::fs::rename(&parked, &e.manifests).expect("restore the directory");
    e.eventually("the devices declared", |e| {
        e.twin("default/oven-1").map(|_| ())
    });
    e.eventually("healthy again", |e| (healthz(e) == "ok").then_some(()));
}

#[test]
fn running_out_of_file_descriptors_keeps_every_twin_and_the_listeners() {
    let mut e = Edgecore::start(None);
    set(&e, 55);
    e.restart_with_nofile(128);
    let addr = e.http.trim_start_matches("http://").to_string();
    let idle: Vec<_> = (0..200)
        .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
        .collect();
    assert!(idle.len() >= 100, "{} connections opened", idle.len());
    // The watcher lists the directory while no descriptor is left.
    std::thread::sleep(Duration::from_millis(300));
    let file = e.manifests.join("oven.yaml");
    let text = std::fs::read_to_string(&file).expect("manifest");
    std::fs::write(&file, format!("{text}\n# touched\n")).expect("touch");
    std::thread::sleep(Duration::from_secs(2));
    drop(idle);
    e.eventually("the HTTP API answers again", |e| {
        (e.get("/healthz").0 == 200).then_some(())
    });
    assert_eq!(desired_of(&e, "setpoint").as_deref(), Some("55"));
    e.eventually("healthy again", |e| (healthz(e) == "ok").then_some(()));
    set(&e, 56);
    assert_eq!(desired_of(&e, "setpoint").as_deref(), Some("56"));
}

/// A small tmpfs at `dir`, unmounted on drop; `None` when this process may not mount.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            sim::skip("cannot mount a tmpfs (not root)");
            return None;
        }
        Some(Self(dir.to_path_buf()))
    }

    /// Fills the disk; returns the filler to remove.
    fn fill(&self) -> PathBuf {
        let filler = self.0.join("filler");
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=64k"])
            .arg(format!("of={}", filler.display()))
            .stderr(std::process::Stdio::null())
            .status();
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// edgecore with its data directory on a 6 MiB tmpfs.
fn on_small_disk() -> Option<(Edgecore, SmallDisk)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SmallDisk::mount(&dir.path().join("data"), "6m")?;
    std::fs::create_dir_all(dir.path().join("manifests")).expect("mkdir");
    std::fs::write(dir.path().join("manifests/oven.yaml"), MANIFEST).expect("manifest");
    let mut e = Edgecore::with_dir(dir, None);
    e.wait_ready();
    Some((e, disk))
}

#[test]
fn a_full_disk_refuses_writes_with_507_keeps_what_was_acknowledged_and_recovers_by_itself() {
    let Some((mut e, disk)) = on_small_disk() else {
        return;
    };
    for v in 1..=60 {
        set(&e, v);
    }
    let filler = disk.fill();
    // Writes now either still fit (the journal reuses its space) and are acknowledged, or are
    // refused with 507 and a reason; nothing in between.
    let mut acked = 60;
    let mut refused = None;
    // Values cycle within the model's range (0..=300), each differing from the last.
    for v in 61..=4000u32 {
        let v = v % 300;
        let (status, body) = e.put(
            &format!("{OVEN}/desired"),
            &format!("{{\"setpoint\": {v}}}"),
        );
        match status {
            200 => acked = v,
            507 => {
                refused = Some(body);
                break;
            }
            other => panic!("write {v}: {other} {body}"),
        }
    }
    let refused = refused.expect("a full disk refuses writes");
    assert!(refused.to_string().contains("disk is full"), "{refused}");
    // Reads go on, and the service says it is degraded.
    assert_eq!(desired_of(&e, "setpoint"), Some(acked.to_string()));
    assert!(healthz(&e).contains("refuses writes"), "{}", healthz(&e));
    assert_eq!(e.get("/readyz").0, 503);
    let m = e.get("/metrics").1;
    assert!(
        m.as_str()
            .unwrap_or("")
            .lines()
            .any(|l| l == "edgecore_twin_store_degraded 1"),
        "{m}"
    );
    // Space comes back: writes are accepted again without a restart.
    std::fs::remove_file(&filler).expect("free the disk");
    let start = Instant::now();
    // 300: a value the writes above never stored (they cycle through 0..300); a refused try
    // stores nothing, so each retry is a real write.
    let v = 300;
    loop {
        let (status, _) = e.put(
            &format!("{OVEN}/desired"),
            &format!("{{\"setpoint\": {v}}}"),
        );
        if status == 200 {
            acked = v;
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "writes still refused"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    e.eventually("healthy again", |e| (healthz(e) == "ok").then_some(()));
    // Everything acknowledged survives a crash.
    e.restart(true);
    assert_eq!(desired_of(&e, "setpoint"), Some(acked.to_string()));
}

#[test]
fn a_start_on_a_full_disk_keeps_the_data_and_says_so() {
    let Some((mut e, disk)) = on_small_disk() else {
        return;
    };
    for v in 1..=40 {
        set(&e, v);
    }
    e.stop(true);
    let filler = disk.fill();
    e.start_again();
    e.wait_ready();
    assert_eq!(desired_of(&e, "setpoint").as_deref(), Some("40"));
    std::fs::remove_file(&filler).expect("free the disk");
    e.restart(false);
    assert_eq!(desired_of(&e, "setpoint").as_deref(), Some("40"));
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

/// The files that hold the twins and the pods' Secrets, and the directory they are in.
fn data_files(data: &Path) -> Vec<PathBuf> {
    ["edgecore.db", "edgecore-log.db"]
        .iter()
        .flat_map(|db| ["", "-wal", "-shm"].map(|s| data.join(format!("{db}{s}"))))
        .filter(|p| p.exists())
        .collect()
}

#[test]
fn the_data_is_private_whatever_the_umask_and_made_so_again_at_start() {
    let mut e = Edgecore::start(None);
    let data = e.dir.path().join("data");
    e.stop(false);
    // A fresh start with nothing masked: what it makes is still its owner's only.
    std::fs::remove_dir_all(&data).expect("data removed");
    e.restart_with_umask("000");
    set(&e, 7);
    let files = data_files(&data);
    assert!(
        files.iter().any(|f| f.ends_with("edgecore.db-wal")),
        "the WAL is there: {files:?}"
    );
    assert_eq!(mode(&data), 0o700, "{}", data.display());
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    // A data directory opened up (by hand, by an older version) is closed again at start.
    e.stop(false);
    use std::os::unix::fs::PermissionsExt;
    for p in std::iter::once(data.clone()).chain(data_files(&data)) {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("opened");
    }
    e.restart_with_umask("000");
    assert_eq!(mode(&data), 0o700);
    for f in data_files(&data) {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
    assert_eq!(desired_of(&e, "setpoint").as_deref(), Some("7"));
}

/// History never costs the twins: with the disk below the history's `minFreeBytes`, reports go
/// on being stored and shown in the twin while the history drops them (and says so in
/// /metrics) and gives its old points' space back; with space back, it takes values again.
#[test]
fn a_nearly_full_disk_drops_history_and_keeps_the_twins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(disk) = SmallDisk::mount(&dir.path().join("data"), "12m") else {
        return;
    };
    std::fs::create_dir_all(dir.path().join("manifests")).expect("mkdir");
    std::fs::write(dir.path().join("manifests/oven.yaml"), MANIFEST).expect("manifest");
    let e = Edgecore::with_dir_config(dir, "history: {minFreeBytes: 4194304}");
    let m = common::mapper::TestMapper::start("modbus-d", &e.dir.path().join("m.sock"), &e.socket);
    m.register("modbus").expect("MapperRegister");
    let history = |e: &Edgecore| -> Vec<String> {
        let (_, doc) =
            e.get("/api/v1/devices/default/oven-1/properties/temperature/history?from=-1h");
        doc["points"]
            .as_array()
            .map(|ps| ps.iter().map(|p| p["v"].to_string()).collect())
            .unwrap_or_default()
    };
    m.report("default", "oven-1", &[("temperature", "1.5")])
        .expect("report");
    e.eventually("1.5 in the history", |e| {
        (history(e) == ["1.5"]).then_some(())
    });

    // Fill the disk to 2 MiB free: below the history's 4 MiB, room enough for the twins.
    let free = |p: &Path| -> u64 {
        let out = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(p)
            .output()
            .expect("df");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(0)
    };
    let filler = disk.0.join("filler");
    let blocks = free(&disk.0).saturating_sub(2 << 20) / 65536;
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=64k", &format!("count={blocks}")])
        .arg(format!("of={}", filler.display()))
        .stderr(std::process::Stdio::null())
        .status();
    assert!(free(&disk.0) < 4 << 20, "the disk is not nearly full");
    for v in ["2.5", "3.5", "4.5"] {
        m.report("default", "oven-1", &[("temperature", v)])
            .expect("the twin takes the report");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        e.twin("default/oven-1")
            .and_then(|t| reported(&t, "temperature"))
            .as_deref(),
        Some("4.5")
    );
    e.eventually("the history's drops counted", |e| {
        e.metrics()
            .lines()
            .any(|l| l.starts_with("edgecore_history_dropped_total") && !l.ends_with(" 0"))
            .then_some(())
    });
    // Nothing new in the history (and its old points given back to the disk: history yields
    // its space to the twins).
    let kept = history(&e);
    assert!(
        kept.iter().all(|v| v == "1.5"),
        "values written to the history on a nearly full disk: {kept:?}"
    );

    // Space again: the history takes values again.
    std::fs::remove_file(&filler).expect("free the disk");
    m.report("default", "oven-1", &[("temperature", "5.5")])
        .expect("report");
    e.eventually("5.5 in the history", |e| {
        history(e).last().is_some_and(|v| v == "5.5").then_some(())
    });
}
