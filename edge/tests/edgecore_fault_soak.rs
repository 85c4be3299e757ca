//! Faults mixed under load: writers set desired values as fast as edgecore takes them while the
//! test kills it with SIGKILL, fills its disk (a tmpfs, when running as root) and takes its
//! manifests directory away, in turn. At the end every acknowledged value must read back. Short
//! by default; `FAULT_SOAK_SECS=600 cargo test -p edge --test edgecore_fault_soak -- --nocapture`
//! runs it for longer and prints the figures.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DEVICES: usize = 12;
const PROPS: usize = 4;

fn manifests() -> String {
    let props: String = (0..PROPS)
        .map(|p| format!("    - {{name: p{p}, type: INT, accessMode: ReadWrite}}\n"))
        .collect();
    let mut out = format!(
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {{name: m, namespace: default}}\nspec:\n  protocol: modbus\n  properties:\n{props}"
    );
    for d in 0..DEVICES {
        let visitors: String = (0..PROPS)
            .map(|p| format!("    - {{name: p{p}, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: {p}}}}}}}\n"))
            .collect();
        out.push_str(&format!(
            "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: d{d}, namespace: default}}\nspec:\n  deviceModelRef: {{name: m}}\n  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1, port: 5020}}}}\n  properties:\n{visitors}"
        ));
    }
    out
}

/// What a writer knows of one property: the last value acknowledged, and the values sent after
/// it whose outcome is unknown (the connection broke: edgecore may or may not have stored them).
#[derive(Default, Clone)]
struct Known {
    acked: Option<u64>,
    unknown: Vec<u64>,
}

type Book = Arc<Mutex<BTreeMap<(usize, usize), Known>>>;

fn writer(
    http: String,
    devices: Vec<usize>,
    book: Book,
    stop: Arc<AtomicBool>,
    acks: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut value = 0u64;
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let d = devices[i % devices.len()];
        let p = (i / devices.len()) % PROPS;
        value += 1;
        let url = format!("{http}/api/v1/devices/default/d{d}/desired");
        let r = agent
            .put(&url)
            .header("content-type", "application/json")
            .send(format!("{{\"p{p}\": {value}}}"));
        let mut book = book.lock().expect("book");
        let k = book.entry((d, p)).or_default();
        match r {
            Ok(resp) if resp.status().as_u16() == 200 => {
                k.acked = Some(value);
                k.unknown.clear();
                acks.fetch_add(1, Ordering::Relaxed);
            }
            // Refused on a full disk: not stored.
            Ok(resp) if resp.status().as_u16() == 507 => {
                refused.fetch_add(1, Ordering::Relaxed);
                drop(book);
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(resp) => panic!("PUT {url}: {}", resp.status()),
            Err(_) => {
                k.unknown.push(value);
                drop(book);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

struct Disk(PathBuf);

impl Disk {
    fn mount(dir: &Path) -> Option<Self> {
        std::fs::create_dir_all(dir).ok()?;
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
            .arg(dir)
            .status()
            .ok()?
            .success()
            .then(|| Self(dir.to_path_buf()))
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn every_acknowledged_value_survives_kill_9_full_disks_and_manifest_flaps_under_load() {
    let secs: u64 = std::env::var("FAULT_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = Disk::mount(&dir.path().join("data"));
    if disk.is_none() {
        eprintln!("full-disk episodes skipped: cannot mount a tmpfs (not root)");
    }
    std::fs::create_dir_all(dir.path().join("manifests")).expect("mkdir");
    std::fs::write(dir.path().join("manifests/devices.yaml"), manifests()).expect("manifest");
    let mut e = Edgecore::with_dir(dir, None);
    e.wait_ready();

    let book: Book = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let devices = (0..DEVICES).filter(|d| d % 2 == w).collect();
            let (http, book, stop, acks, refused) = (
                e.http.clone(),
                book.clone(),
                stop.clone(),
                acks.clone(),
                refused.clone(),
            );
            std::thread::spawn(move || writer(http, devices, book, stop, acks, refused))
        })
        .collect();

    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut episodes: BTreeMap<&str, u32> = BTreeMap::new();
    let mut recoveries: Vec<Duration> = Vec::new();
    let parked = e.dir.path().join("manifests.parked");
    let mut round = 0u32;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(400));
        round += 1;
        match round % 3 {
            0 => {
                e.restart(true);
                *episodes.entry("kill -9").or_default() += 1;
            }
            1 => {
                let Some(d) = &disk else { continue };
                let filler = d.0.join("filler");
                let _ = Command::new("dd")
                    .args(["if=/dev/zero", "bs=64k"])
                    .arg(format!("of={}", filler.display()))
                    .stderr(std::process::Stdio::null())
                    .status();
                // Until writes are refused (the journal may still have room for a while).
                let was = refused.load(Ordering::Relaxed);
                let filled = Instant::now();
                while refused.load(Ordering::Relaxed) == was
                    && filled.elapsed() < Duration::from_secs(5)
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let refusing = refused.load(Ordering::Relaxed) > was;
                std::thread::sleep(Duration::from_millis(300));
                let before = acks.load(Ordering::Relaxed);
                std::fs::remove_file(&filler).expect("free the disk");
                let freed = Instant::now();
                while acks.load(Ordering::Relaxed) == before
                    && freed.elapsed() < Duration::from_secs(30)
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if freed.elapsed() >= Duration::from_secs(30) {
                    let ls = Command::new("sh")
                        .arg("-c")
                        .arg(format!("ls -la {0}; df {0}", d.0.display()))
                        .output()
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_default();
                    panic!(
                        "writes not accepted 30 s after space returned: healthz {:?}\n{ls}",
                        e.get("/healthz").1,
                    );
                }
                if refusing {
                    recoveries.push(freed.elapsed());
                    *episodes.entry("full disk (writes refused)").or_default() += 1;
                } else {
                    *episodes
                        .entry("full disk (writes still fitted)")
                        .or_default() += 1;
                }
            }
            _ => {
                std::fs::rename(&e.manifests, &parked).expect("take the manifests away");
                std::thread::sleep(Duration::from_millis(700));
                std::fs::rename(&parked, &e.manifests).expect("put them back");
                *episodes.entry("manifests gone").or_default() += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().expect("writer");
    }
    e.restart(true);
    e.eventually("healthy", |e| {
        (e.get("/healthz").1.as_str() == Some("ok")).then_some(())
    });

    let book = book.lock().expect("book").clone();
    let mut lost = Vec::new();
    let mut checked = 0;
    for ((d, p), k) in &book {
        let Some(acked) = k.acked else { continue };
        checked += 1;
        let twin = e
            .twin(&format!("default/d{d}"))
            .expect("the device is there");
        let have: Option<u64> = desired(&twin, &format!("p{p}")).and_then(|v| v.parse().ok());
        let ok = have == Some(acked) || have.is_some_and(|h| k.unknown.contains(&h));
        if !ok {
            lost.push(format!("d{d}.p{p}: acknowledged {acked}, reads {have:?}"));
        }
    }
    recoveries.sort();
    let median = recoveries
        .get(recoveries.len() / 2)
        .copied()
        .unwrap_or_default();
    let max = recoveries.last().copied().unwrap_or_default();
    println!(
        "fault soak: {secs} s, episodes {episodes:?}, acknowledged writes {}, refused (507) {}, properties checked {checked}, lost {}, writes accepted again after space returned: median {median:?}, max {max:?}",
        acks.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        lost.len()
    );
    assert!(lost.is_empty(), "acknowledged values lost: {lost:?}");
    assert!(checked > 0 && acks.load(Ordering::Relaxed) > 0);
}
