//! The Python simulators of `sims/` (pymodbus and its random server), and a Modbus client to
//! read and write their registers from a test.

use super::*;

/// A Python simulator from `sims/`, started and waited for until it prints `ready`; killed on
/// drop.
pub struct PySim {
    pub proc: Child,
}

impl PySim {
    /// `python3 sims/SCRIPT ARGS`; `install` says what to install when it does not start.
    pub fn start(script: &str, args: &[&str], install: &str) -> Self {
        use std::io::{BufRead, BufReader};
        let path = sims_dir().join(script);
        let mut proc = Command::new(python())
            .arg(&path)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e} ({SETUP_HINT})", python().display()));
        let out = proc.stdout.take().expect("piped");
        let ready = BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.trim() == "ready");
        assert!(
            ready,
            "{script} {args:?} did not start: {SETUP_HINT} (or {install})"
        );
        Self { proc }
    }

    pub fn kill(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

impl Drop for PySim {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `f` with a tokio-modbus TCP client of the server on 127.0.0.1:`port` (a test's own look
/// at a simulator's registers, beside what the mapper reads).
fn modbus_client<T>(port: u16, f: impl AsyncFnOnce(&mut tokio_modbus::client::Context) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut ctx = tokio_modbus::client::tcp::connect(([127, 0, 0, 1], port).into())
            .await
            .expect("connect to the Modbus server");
        f(&mut ctx).await
    })
}

/// Holding register `address` of the Modbus TCP server on 127.0.0.1:`port`.
pub fn read_holding(port: u16, address: u16) -> u16 {
    use tokio_modbus::client::Reader;
    modbus_client(port, async |ctx| {
        ctx.read_holding_registers(address, 1)
            .await
            .expect("transport")
            .expect("no exception")[0]
    })
}

/// Writes `values` to the holding registers from `address` of the Modbus TCP server on
/// 127.0.0.1:`port`.
pub fn write_holdings(port: u16, address: u16, values: &[u16]) {
    use tokio_modbus::client::Writer;
    modbus_client(port, async |ctx| {
        ctx.write_multiple_registers(address, values)
            .await
            .expect("transport")
            .expect("no exception")
    })
}

/// pymodbus's Modbus TCP server (`sims/modbus_server.py`), a simulator the project did not write.
pub struct PyModbus {
    pub sim: PySim,
    pub port: u16,
}

const PYMODBUS: &str = "pip install 'pymodbus[serial]==3.16.*'";

impl PyModbus {
    /// Modbus TCP on 127.0.0.1:`port`.
    pub fn start(port: u16) -> Self {
        Self {
            sim: PySim::start("modbus_server.py", &[&port.to_string()], PYMODBUS),
            port,
        }
    }

    /// Modbus RTU on the serial device `path` (one end of a pty pair).
    pub fn start_rtu(path: &Path) -> Self {
        Self {
            sim: PySim::start(
                "modbus_server.py",
                &[&format!("rtu:{}", path.display())],
                PYMODBUS,
            ),
            port: 0,
        }
    }
}

/// pymodbus serving units whose layout is drawn at random from a seed
/// (`sims/modbus_random.py`): over TCP, or as slaves on an RTU line that only answer at its
/// settings. Every request pymodbus receives is logged, so a test can tell whether anything was
/// written.
pub struct PyModbusRandom {
    pub sim: PySim,
    /// Unit id (as text) -> the items drawn: `table`, `address`, `kind`, `count`, `value`.
    pub layout: serde_json::Value,
    requests: PathBuf,
}

impl PyModbusRandom {
    /// Modbus TCP on 127.0.0.1:`port`, the units `units` (`1,2`), files in `dir`.
    pub fn tcp(port: u16, units: &str, seed: u64, dir: &Path) -> Self {
        Self::start(&format!("tcp:{port}"), units, seed, dir, &[])
    }

    /// Modbus RTU slaves `units` on a line whose client end is linked at `link`, answering only
    /// at `baud` with `parity` (N, E or O; a pty cannot tell E from N) and `stop` bits.
    pub fn line(
        link: &Path,
        units: &str,
        (baud, parity, stop): (u32, char, u8),
        seed: u64,
        dir: &Path,
    ) -> Self {
        Self::start(
            &format!("line:{}", link.display()),
            units,
            seed,
            dir,
            &[
                "--baud",
                &baud.to_string(),
                "--parity",
                &parity.to_string(),
                "--stop",
                &stop.to_string(),
            ],
        )
    }

    fn start(where_: &str, units: &str, seed: u64, dir: &Path, more: &[&str]) -> Self {
        let layout = dir.join(format!("layout-{seed}.json"));
        let requests = dir.join(format!("requests-{seed}.log"));
        let (seed_s, layout_s, requests_s) = (
            seed.to_string(),
            layout.display().to_string(),
            requests.display().to_string(),
        );
        let mut args = vec![
            where_,
            "--units",
            units,
            "--seed",
            &seed_s,
            "--layout",
            &layout_s,
            "--requests",
            &requests_s,
        ];
        args.extend_from_slice(more);
        let sim = PySim::start("modbus_random.py", &args, PYMODBUS);
        let text = std::fs::read_to_string(&layout).expect("the drawn layout");
        Self {
            sim,
            layout: serde_json::from_str(&text).expect("the layout is JSON"),
            requests,
        }
    }

    /// Every request received: `(unit, function code)`.
    pub fn requests(&self) -> Vec<(u8, u8)> {
        std::fs::read_to_string(&self.requests)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
            })
            .collect()
    }

    /// The requests that write (function codes 5, 6, 15, 16, 22, 23).
    pub fn writes(&self) -> Vec<(u8, u8)> {
        self.requests()
            .into_iter()
            .filter(|(_, fc)| matches!(fc, 5 | 6 | 15 | 16 | 22 | 23))
            .collect()
    }
}
