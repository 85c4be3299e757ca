//! `pushMethod.dbMethod` and `pushMethod.otel` against real servers on loopback, none written by
//! the project: Redis (`redis-server`, read back with `redis-cli`), MariaDB (`mariadbd`, read
//! back with the `mariadb` client), InfluxDB 2's write API as VictoriaMetrics serves it
//! (`victoria-metrics`, read back from its export API), and an OTLP/HTTP receiver that decodes
//! with the official `opentelemetry-proto` package (`sims/otlp_receiver.py`). The values come from
//! pymodbus through the real `edgecore` and `mapper-modbus`. `.ci/run` installs the servers:
//! `apt-get install redis-server mariadb-server victoria-metrics` and
//! `pip install opentelemetry-proto`.

use sim::{Node, PyModbus, PySim, eventually, free_port, reported, write_holdings};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A server process, killed on drop.
struct Server(Child);

/// `program` from `PATH`, or from the system directories a non-root `PATH` lacks (Debian puts
/// `mariadbd` in /usr/sbin).
fn program(name: &str) -> std::path::PathBuf {
    let in_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    in_path
        .into_iter()
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| name.into())
}

impl Server {
    fn start(program_name: &str, args: &[&str], install: &str) -> Self {
        let child = Command::new(program(program_name))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {program_name}: {e} (install it: {install}, or run scripts/test)"
                )
            });
        Self(child)
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_port(port: u16, what: &str) {
    eventually(20, what, || {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(|_| ())
    });
}

fn output(name: &str, args: &[&str]) -> String {
    let out = Command::new(program(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {name}: {e} (run scripts/test to install it)"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn redis(port: u16) -> Server {
    let p = port.to_string();
    let s = Server::start(
        "redis-server",
        &[
            "--port",
            &p,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--requirepass",
            "secret",
        ],
        "apt-get install redis-server",
    );
    wait_port(port, "redis-server listening");
    s
}

fn redis_members(port: u16, key: &str) -> String {
    output(
        "redis-cli",
        &[
            "-p",
            &port.to_string(),
            "-a",
            "secret",
            "--no-auth-warning",
            "ZRANGE",
            key,
            "0",
            "-1",
        ],
    )
}

/// Whether the tests run as root (mariadbd then needs `--user=root`; as anyone else it runs as
/// them).
fn root() -> bool {
    output("id", &["-u"]).trim() == "0"
}

/// MariaDB on a fresh data directory, with database `kubeedge` and user `mapper`/`secret`.
fn mariadb(dir: &Path, port: u16) -> Server {
    let data = dir.join("mariadb");
    let socket = dir.join("mariadb.sock");
    // As root, mariadbd must be told to stay root; as anyone else it runs as them.
    let as_root: &[&str] = if root() { &["--user=root"] } else { &[] };
    let install = Command::new(program("mariadb-install-db"))
        .args([
            "--no-defaults",
            &format!("--datadir={}", data.display()),
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ])
        .args(as_root)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run mariadb-install-db: {e} (apt-get install mariadb-server)")
        });
    assert!(
        install.status.success(),
        "{}",
        String::from_utf8_lossy(&install.stderr)
    );
    let mut args = vec![
        "--no-defaults".to_string(),
        format!("--datadir={}", data.display()),
        format!("--port={port}"),
        "--bind-address=127.0.0.1".to_string(),
        format!("--socket={}", socket.display()),
        "--skip-log-bin".to_string(),
    ];
    args.extend(as_root.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = Server::start("mariadbd", &args, "apt-get install mariadb-server");
    wait_port(port, "mariadbd listening");
    let sock = format!("--socket={}", socket.display());
    sim::run(Command::new(program("mariadb")).args([
        "--no-defaults",
        &sock,
        "-u",
        "root",
        "-e",
        "CREATE DATABASE kubeedge; CREATE USER 'mapper'@'%' IDENTIFIED BY 'secret'; \
             GRANT ALL ON kubeedge.* TO 'mapper'@'%';",
    ]));
    s
}

fn mysql_fields(port: u16, table: &str) -> String {
    output(
        "mariadb",
        &[
            "--no-defaults",
            "-h",
            "127.0.0.1",
            "-P",
            &port.to_string(),
            "-u",
            "mapper",
            "-psecret",
            "kubeedge",
            "-N",
            "-e",
            &format!("SELECT field FROM `{table}` ORDER BY id"),
        ],
    )
}

fn http_text(url: &str) -> String {
    ureq::get(url)
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .unwrap_or_default()
}

fn manifests(modbus: u16, vm: u16, redis: u16, mysql: u16, otel: u16) -> String {
    let push = format!(
        r#"
      pushMethod:
        otel: {{endpointURL: "http://127.0.0.1:{otel}/v1/metrics"}}
        dbMethod:
          influxdb2:
            influxdb2ClientConfig: {{url: "http://127.0.0.1:{vm}", org: test-org, bucket: test-bucket}}
            influxdb2DataConfig: {{measurement: plc, tag: {{site: hall-1}}}}
          redis: {{redisClientConfig: {{addr: "127.0.0.1:{redis}", db: 0}}}}
          mysql: {{mysqlClientConfig: {{addr: "127.0.0.1:{mysql}", database: kubeedge, userName: mapper}}}}"#
    );
    let mut out = sim::fill(
        include_str!("manifests/push_targets.yaml"),
        &[("modbus", &modbus), ("push", &push)],
    );
    // A device that pushes 32 values every 50 ms to Redis: enough to fill its queue quickly
    // while Redis is down.
    for i in 0..32 {
        out.push_str(&format!(
            "    - {{name: c{i}, type: INT, accessMode: ReadOnly}}\n"
        ));
    }
    out.push_str(&sim::fill(
        include_str!("manifests/push_targets_burst.yaml"),
        &[("modbus", &modbus)],
    ));
    for i in 0..32 {
        out.push_str(&format!(
            r#"    - name: c{i}
      collectCycle: 50
      reportCycle: 50
      visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 31, limit: 1}}}}
      pushMethod: {{dbMethod: {{redis: {{redisClientConfig: {{addr: "127.0.0.1:{redis}"}}}}}}}}
"#
        ));
    }
    out
}

fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn values_reach_redis_mariadb_influx_and_otlp_and_a_dead_sink_drops_without_blocking_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (redis_port, mysql_port, vm_port, otel_port) =
        (free_port(), free_port(), free_port(), free_port());
    let mut redis_server = redis(redis_port);
    let _mariadb = mariadb(dir.path(), mysql_port);
    let vm_data = dir.path().join("vm");
    let _vm = Server::start(
        "victoria-metrics",
        &[
            &format!("-httpListenAddr=127.0.0.1:{vm_port}"),
            &format!("-storageDataPath={}", vm_data.display()),
            "-search.latencyOffset=0s",
            "-loggerLevel=ERROR",
        ],
        "apt-get install victoria-metrics",
    );
    wait_port(vm_port, "victoria-metrics listening");
    let _otel = PySim::start(
        "otlp_receiver.py",
        &[&otel_port.to_string()],
        "pip install 'opentelemetry-proto==1.*'",
    );
    let sim = PyModbus::start(free_port());
    write_holdings(sim.port, 30, &[77]);
    let node = Node::start(&manifests(
        sim.port, vm_port, redis_port, mysql_port, otel_port,
    ));
    let rest = free_port();
    let _mapper = node.mapper_env(
        "mapper-modbus",
        "modbus",
        rest,
        &[
            ("PASSWORD", "secret".into()),
            ("TOKEN", "test-token".into()),
        ],
    );

    // InfluxDB line protocol: measurement plc, the configured tag and the device, field named
    // after the property, an integer and a float.
    let export = |query: &str| {
        http_text(&format!(
            "http://127.0.0.1:{vm_port}/api/v1/export?match[]={query}"
        ))
    };
    eventually(30, "influxdb2 points in victoria-metrics", || {
        let t = export("%7B__name__%3D%22plc_temperature%22%7D");
        (t.contains("\"site\":\"hall-1\"")
            && t.contains("\"device\":\"default/plc-1\"")
            && t.contains("77"))
        .then_some(())
    });
    eventually(10, "the float field", || {
        export("%7B__name__%3D%22plc_pressure%22%7D")
            .contains("123.456")
            .then_some(())
    });
    // Redis: ZADD under the device name, members in JSON.
    eventually(10, "redis members", || {
        let m = redis_members(redis_port, "plc-1");
        (m.contains("\"property\":\"temperature\"") && m.contains("\"value\":\"77\"")).then_some(())
    });
    // MariaDB: one table per property.
    eventually(10, "mariadb rows", || {
        mysql_fields(mysql_port, "default/plc-1/temperature")
            .lines()
            .any(|l| l.trim() == "77")
            .then_some(())
    });
    // OTLP: accepted by the official schema, a gauge per property with typed points.
    let points = || http_text(&format!("http://127.0.0.1:{otel_port}/points"));
    eventually(10, "otlp points", || {
        let p = points();
        (p.contains("\"metric\": \"temperature\"")
            && p.contains("\"device\": \"plc-1\"")
            && p.contains("\"value\": 77")
            && p.contains("\"metric\": \"pressure\""))
        .then_some(())
    });

    // Redis goes away: its queue fills and what does not fit is dropped and counted, while reads
    // and the other sinks carry on.
    redis_server.kill();
    write_holdings(sim.port, 30, &[78]);
    eventually(10, "reads go on", || {
        (reported(&node.twin("default/plc-1")?, "temperature")? == "78").then_some(())
    });
    let metrics = || http_text(&format!("http://127.0.0.1:{rest}/metrics"));
    let dropped = eventually(30, "values dropped for the dead redis, and counted", || {
        let d = counter(&metrics(), "mapper_push_dropped_total");
        (d > 0.0).then_some(d)
    });
    assert!(
        counter(&metrics(), "mapper_push_errors_total") > 0.0,
        "{}",
        metrics()
    );
    eventually(10, "the other sinks still take values", || {
        (mysql_fields(mysql_port, "default/plc-1/temperature")
            .lines()
            .any(|l| l.trim() == "78")
            && points().contains("\"value\": 78"))
        .then_some(())
    });
    println!("dropped while redis was down: {dropped}");

    // Redis is back: pushes resume by themselves.
    let _redis_again = redis(redis_port);
    write_holdings(sim.port, 30, &[79]);
    eventually(30, "redis gets new values again", || {
        redis_members(redis_port, "plc-1")
            .contains("\"value\":\"79\"")
            .then_some(())
    });
    std::thread::sleep(Duration::from_millis(10));
}
