//! BLE peripherals behind a scripted BlueZ, for mapper-ble's tests: a private D-Bus bus (a
//! `dbus-daemon` of the test's own, so tests run side by side and need no root), python-dbusmock's
//! `bluez5` template on it as BlueZ, and `sims/ble_peripherals.py` adding the devices and their
//! GATT characteristics and changing them on command. Give the mapper [`BlueZ::env`] so that
//! btleplug takes this bus for the system bus.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// What to install when the rig cannot start.
pub const INSTALL: &str =
    "apt-get install dbus python3-dbusmock (and libdbus-1-dev pkg-config to build mapper-ble)";

pub struct BlueZ {
    /// The bus address (`unix:path=...`).
    pub bus: String,
    daemon: Child,
    sim: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    _dir: tempfile::TempDir,
}

/// A Python that has `dbusmock` (Debian's package is for the system Python; the project's
/// `.venv` sees it, another `python3` earlier in `PATH` may not).
fn python() -> Option<std::path::PathBuf> {
    [crate::python(), "python3".into(), "/usr/bin/python3".into()]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .args(["-c", "import dbus, dbusmock"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

impl BlueZ {
    /// BlueZ with adapter `hci0` and the devices of `spec` (see `sims/ble_peripherals.py`).
    pub fn start(spec: &Value) -> Self {
        Self::try_start(spec).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`BlueZ::start`], or why it cannot start (what to install).
    pub fn try_start(spec: &Value) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("no temp dir: {e}"))?;
        let socket = dir.path().join("bus");
        let bus = format!("unix:path={}", socket.display());
        let mut daemon = Command::new("dbus-daemon")
            .args([
                "--session",
                "--nofork",
                "--nopidfile",
                &format!("--address={bus}"),
            ])
            .stdout(Stdio::null())
            // It warns that it cannot raise its file limit without root; harmless here.
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run dbus-daemon: {e} ({INSTALL})"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if Instant::now() > deadline {
                let _ = daemon.kill();
                return Err(format!("dbus-daemon did not listen on {bus}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let spec_file = dir.path().join("spec.json");
        std::fs::write(&spec_file, spec.to_string()).map_err(|e| format!("spec: {e}"))?;
        let Some(py) = python() else {
            let _ = daemon.kill();
            return Err(format!("no python3 with dbusmock ({INSTALL})"));
        };
        let script = crate::sims_dir().join("ble_peripherals.py");
        let mut sim = match Command::new(py)
            .arg(script)
            .arg(&spec_file)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &bus)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
        {
            Ok(s) => s,
            Err(e) => {
                let _ = daemon.kill();
                return Err(format!("python does not run: {e}"));
            }
        };
        let (Some(stdin), Some(stdout)) = (sim.stdin.take(), sim.stdout.take()) else {
            return Err("no pipes to the BLE simulator".into());
        };
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        let _ = stdout.read_line(&mut line);
        let this = Self {
            bus,
            daemon,
            sim,
            stdin,
            stdout,
            _dir: dir,
        };
        if line.trim() != "ready" {
            return Err(format!("ble_peripherals.py did not start ({INSTALL})"));
        }
        Ok(this)
    }

    /// The environment that points a BlueZ client (the mapper) at this bus.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![("DBUS_SYSTEM_BUS_ADDRESS", self.bus.clone())]
    }

    /// One command of `sims/ble_peripherals.py`; its answer after `ok`, or a panic.
    pub fn command(&mut self, line: &str) -> String {
        self.try_command(line).unwrap_or_else(|e| panic!("{e}"))
    }

    /// One command; its answer after `ok`, or what went wrong.
    pub fn try_command(&mut self, line: &str) -> Result<String, String> {
        writeln!(self.stdin, "{line}").map_err(|e| format!("BLE simulator gone: {e}"))?;
        let mut answer = String::new();
        self.stdout
            .read_line(&mut answer)
            .map_err(|e| format!("BLE simulator gone: {e}"))?;
        match answer.trim().strip_prefix("ok") {
            Some(rest) => Ok(rest.trim().to_string()),
            None => Err(format!("BLE simulator: {line:?} failed: {answer}")),
        }
    }

    /// The characteristic changes (a notification when the client subscribed).
    pub fn set(&mut self, address: &str, characteristic: &str, hex: &str) {
        self.command(&format!("set {address} {characteristic} {hex}"));
    }

    /// The characteristic's value as lower-case hex.
    pub fn get(&mut self, address: &str, characteristic: &str) -> String {
        self.command(&format!("get {address} {characteristic}"))
    }

    /// How many reads the characteristic has answered.
    pub fn reads(&mut self, address: &str, characteristic: &str) -> u64 {
        self.command(&format!("reads {address} {characteristic}"))
            .parse()
            .unwrap_or(0)
    }

    /// How many writes the characteristic has taken.
    pub fn writes(&mut self, address: &str, characteristic: &str) -> u64 {
        self.command(&format!("writes {address} {characteristic}"))
            .parse()
            .unwrap_or(0)
    }

    pub fn connected(&mut self, address: &str) -> bool {
        self.command(&format!("connected {address}")) == "1"
    }

    /// The device drops the connection and goes out of range.
    pub fn vanish(&mut self, address: &str) {
        self.command(&format!("vanish {address}"));
    }

    /// The device is back in range.
    pub fn appear(&mut self, address: &str) {
        self.command(&format!("appear {address}"));
    }
}

impl Drop for BlueZ {
    fn drop(&mut self) {
        let _ = self.sim.kill();
        let _ = self.sim.wait();
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}
