//! The packages as a site runs them: two Debian bookworm systems made by `mmdebstrap` from
//! Debian's own packages, each booted with its own systemd as PID 1 (`systemd-nspawn -b`), side
//! by side on one private network (the gateway joins the cloud host's), and the README's
//! install-and-join section typed in them as root: on the cloud host cloudcore installed,
//! enabled and started, `cloudcore gettoken` as root; on the gateway edgecore and a mapper
//! installed, `edgecore join` with that token; then the node Ready, `/healthz` ok and a device's
//! values in its DeviceStatus. Then an upgrade
//! by package (`apt-get install --reinstall`) restarts the running edgecore, and `edgecore
//! reset` stops and disables every unit join enabled.
//!
//! Runs as root with `mmdebstrap`, `systemd-nspawn` (systemd-container) and `nsenter` on the
//! machine (`scripts/test` installs them) and a Debian mirror reachable; without them it says
//! so and passes. About a minute and a half.

use sim::containerd::run as ok;
use sim::poll::eventually_or;
use sim::{bin, eventually, workspace_root};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A booted Debian: its `systemd-nspawn` and the PID of its systemd.
struct Booted {
    nspawn: Child,
    init: u32,
}

impl Booted {
    /// Boots `root` as `hostname`: on a network of its own, or on the network of the booted
    /// system whose systemd is `beside` (two machines on one private network).
    fn boot(root: &Path, log: &Path, hostname: &str, beside: Option<&Booted>) -> Self {
        let network = match beside {
            None => "--private-network".to_string(),
            Some(b) => format!("--network-namespace-path=/proc/{}/ns/net", b.init),
        };
        let nspawn = Command::new("systemd-nspawn")
            .args(["-D"])
            .arg(root)
            .args(["-b", "--register=no", "--keep-unit"])
            .arg(network)
            .arg(format!("--hostname={hostname}"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log).expect("log"))
            .stderr(Stdio::null())
            .spawn()
            .expect("systemd-nspawn");
        let children = format!("/proc/{0}/task/{0}/children", nspawn.id());
        let init = eventually(30, "the container's systemd", || {
            std::fs::read_to_string(&children)
                .ok()?
                .split_whitespace()
                .next()?
                .parse::<u32>()
                .ok()
        });
        let booted = Self { nspawn, init };
        // A first boot on a busy machine (a CI run) once took longer than a minute: the wait
        // is three, and a boot that does not end says which jobs it was still running.
        eventually_or(180, "systemd running in the container", || {
            let (_, state) = booted.sh("systemctl is-system-running");
            if matches!(state.trim(), "running" | "degraded") {
                return Ok(());
            }
            let (_, jobs) = booted.sh("systemctl list-jobs --no-pager");
            Err(format!("{}; jobs: {jobs}", state.trim()))
        });
        booted
    }

    /// `script` run by `sh` as root inside: whether it succeeded, and what it printed.
    fn sh(&self, script: &str) -> (bool, String) {
        let out = Command::new("nsenter")
            .args(["-t", &self.init.to_string(), "-a", "sh", "-c", script])
            .output()
            .expect("nsenter");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// `script` that must succeed; what it printed.
    fn must(&self, script: &str) -> String {
        let (ok, said) = self.sh(script);
        assert!(ok, "`{script}` in the booted Debian: {said}");
        said
    }

    /// A program of this machine run in the container's network (its loopback).
    fn in_network(&self, program: &Path) -> Command {
        let mut c = Command::new("nsenter");
        c.args(["-t", &self.init.to_string(), "-n"]).arg(program);
        c
    }
}

impl Drop for Booted {
    fn drop(&mut self) {
        // SIGTERM to nspawn stops the container's systemd as a shutdown does.
        let _ = Command::new("kill")
            .arg(self.nspawn.id().to_string())
            .status();
        let stopped = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            matches!(self.nspawn.try_wait(), Ok(Some(_)))
        });
        if !stopped {
            let _ = self.nspawn.kill();
            let _ = self.nspawn.wait();
        }
    }
}

#[test]
fn the_readmes_install_and_join_on_a_booted_debian_ends_with_values_in_devicestatus() {
    if !sim::is_root()
        || !["mmdebstrap", "systemd-nspawn", "nsenter"]
            .iter()
            .all(|t| sim::have(t))
    {
        sim::skip(
            "needs root, mmdebstrap, systemd-nspawn and nsenter (scripts/test installs them)",
        );
        return;
    }
    let work = tempfile::tempdir().expect("tempdir");
    let made = sim::package(&work.path().join("debs"), &[], &[]);
    // The next release of edgecore, to upgrade to as an operator does: a newer .deb.
    let next = format!("{}+next1", env!("CARGO_PKG_VERSION"));
    let newer = sim::package(&work.path().join("newer"), &["--version", &next], &[]);
    let newer_edgecore = newer
        .iter()
        .find(|d| d.to_string_lossy().contains("/edgecore_"))
        .expect("the newer edgecore")
        .clone();
    let root = work.path().join("bookworm");
    let strap = Command::new("mmdebstrap")
        .args([
            "--variant=apt",
            "--include=systemd,systemd-sysv,dbus",
            "bookworm",
        ])
        .arg(&root)
        .output()
        .expect("mmdebstrap");
    if !strap.status.success() {
        sim::skip(&format!(
            "mmdebstrap could not make a bookworm root (no Debian mirror?): {}",
            String::from_utf8_lossy(&strap.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        ));
        return;
    }
    // Two machines: the cloud host and a gateway, each a copy of the same Debian.
    let gateway_root = work.path().join("gateway");
    ok(Command::new("cp").arg("-a").arg(&root).arg(&gateway_root));
    for deb in &made {
        let name = deb.file_name().expect("name").to_string_lossy();
        let into = if name.starts_with("cloudcore_") {
            &root
        } else if name.starts_with("edgecore_") || name.starts_with("mapper-modbus_") {
            &gateway_root
        } else {
            continue;
        };
        std::fs::copy(deb, into.join("root").join(&*name)).expect("copy");
    }
    // Their names, as an installer gives them (systemd reads /etc/hostname at boot).
    std::fs::write(root.join("etc/hostname"), "cloud-host\n").expect("hostname");
    std::fs::write(gateway_root.join("etc/hostname"), "gateway-1\n").expect("hostname");
    let os = Booted::boot(&root, &work.path().join("cloud.log"), "cloud-host", None);
    let gw = Booted::boot(
        &gateway_root,
        &work.path().join("gateway.log"),
        "gateway-1",
        Some(&os),
    );

    // The cloud host, as the README says: installed, enabled, a token as root.
    os.must("cd /root && apt-get install -y -q ./cloudcore_*.deb");
    os.must("systemctl enable --now cloudcore");
    eventually(60, "cloudcore's admin kubeconfig", || {
        os.sh("test -s /var/lib/cloudcore/admin.kubeconfig")
            .0
            .then_some(())
    });
    eventually(30, "a token from cloudcore gettoken, as root", || {
        let (ok, _) = os.sh("cloudcore gettoken > /root/token.txt");
        ok.then_some(())
    });
    let owners = os.must("stat -c '%U %n' /var/lib/cloudcore/pki/*");
    assert!(
        owners.lines().all(|l| l.starts_with("cloudcore ")),
        "root's gettoken leaves the service's files its own: {owners}"
    );

    // The gateway: edgecore and the Modbus mapper, joined in one command with the token the
    // operator carried over.
    std::fs::copy(
        root.join("root/token.txt"),
        gateway_root.join("root/token.txt"),
    )
    .expect("the token to the gateway");
    let installed =
        gw.must("cd /root && apt-get install -y -q ./edgecore_*.deb ./mapper-modbus_*.deb");
    assert!(
        installed.contains("edgecore join --cloud HOST"),
        "{installed}"
    );
    let joined =
        gw.must("edgecore join --cloud 127.0.0.1 --token-file /root/token.txt --mapper modbus");
    assert!(
        joined.contains("edgecore.service enabled and (re)started")
            && joined.contains("mapper-modbus.service enabled and (re)started"),
        "{joined}"
    );
    let node = "gateway-1";
    let kubeconfig = root.join("var/lib/cloudcore/admin.kubeconfig");
    let kubectl = |args: &[&str]| sim::stack::kubectl_with(&kubeconfig, Some(os.init), args);
    let ready = (0..120).any(|_| {
        let (_, ready) = kubectl(&[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        std::thread::sleep(std::time::Duration::from_millis(500));
        ready.trim() == "True"
    });
    assert!(
        ready,
        "the node Ready: {}\n{}\n{}",
        kubectl(&["get", "nodes", "-o", "wide"]).1,
        gw.sh("systemctl status edgecore --no-pager | head -5; journalctl -u edgecore --no-pager | tail -25").1,
        os.sh("journalctl -u cloudcore --no-pager | tail -15").1
    );
    let health = eventually(30, "edgecore's /healthz", || {
        // bash's /dev/tcp: the root has no HTTP client.
        let (ok, said) = gw.sh(
            "bash -c 'exec 3<>/dev/tcp/127.0.0.1/10360 && printf \"GET /healthz HTTP/1.0\\r\\n\\r\\n\" >&3 && cat <&3'",
        );
        ok.then_some(said)
    });
    assert!(
        health.starts_with("HTTP/1.0 200") && health.trim_end().ends_with("ok"),
        "a freshly joined gateway is healthy: {health}"
    );

    // A device: the README's Modbus TCP example on this node, its PLC the project's simulator.
    // (A Proc: killed when the test ends, however it ends; its log shown if it failed.)
    let plc_log = work.path().join("modbus-sim.log");
    let _plc = sim::Proc {
        child: os
            .in_network(&bin("modbus-sim"))
            .arg("--oven")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&plc_log).expect("log"))
            .spawn()
            .expect("modbus-sim"),
        log: plc_log,
    };
    let example = std::fs::read_to_string(workspace_root().join("examples/modbus-tcp.yaml"))
        .expect("example")
        .replace("nodeName: edge-node-1", &format!("nodeName: {node}"));
    let manifest = work.path().join("oven.yaml");
    std::fs::write(&manifest, example).expect("manifest");
    let (applied, said) = kubectl(&["apply", "-f", manifest.to_str().expect("path")]);
    assert!(applied, "{said}");
    eventually(90, "the oven's temperature in its DeviceStatus", || {
        let (_, t) = kubectl(&[
            "get",
            "devicestatus",
            "oven-1",
            "-o",
            "jsonpath={.status.twins[?(@.propertyName==\"temperature\")].reported.value}",
        ]);
        (t.trim() == "66.3").then_some(())
    });

    // An upgrade by package, to the next release, restarts the running edgecore: no old
    // binary left running.
    std::fs::copy(&newer_edgecore, gateway_root.join("root/edgecore-next.deb")).expect("copy");
    let before = gw.must("systemctl show -p MainPID --value edgecore");
    let upgraded = gw.must("cd /root && apt-get install -y -q ./edgecore-next.deb");
    assert!(
        upgraded.contains(&format!("Unpacking edgecore ({next}) over")),
        "{upgraded}"
    );
    // The mapper stays, running: its Depends takes the newer edgecore.
    let mapper = gw.must(
        "dpkg-query -W -f='${Status}' mapper-modbus; echo; systemctl is-active mapper-modbus",
    );
    assert_eq!(
        mapper.split_whitespace().collect::<Vec<_>>(),
        ["install", "ok", "installed", "active"],
        "{upgraded}"
    );
    let after = eventually(30, "edgecore running again after the upgrade", || {
        let (_, pid) =
            gw.sh("systemctl is-active -q edgecore && systemctl show -p MainPID --value edgecore");
        let pid = pid.trim().to_string();
        (!pid.is_empty() && pid != "0" && pid != before.trim()).then_some(pid)
    });
    // (Between systemd's fork and the exec, the new process is still systemd's binary.)
    let exe = eventually(30, "the restarted edgecore's binary", || {
        let (_, exe) = gw.sh(&format!("readlink /proc/{after}/exe"));
        (exe.trim() != "/usr/lib/systemd/systemd").then_some(exe)
    });
    assert_eq!(
        exe.trim(),
        "/usr/bin/edgecore",
        "not the old, deleted binary"
    );
    let reinstalled = gw.must("cd /root && apt-get install -y -q --reinstall ./edgecore-next.deb");
    assert!(
        !reinstalled.contains("edgecore join --cloud HOST"),
        "no join hint on a joined gateway: {reinstalled}"
    );

    // Reset: every unit join enabled, stopped and disabled.
    let reset = gw.must("edgecore reset");
    assert!(
        reset.contains("mapper-modbus.service stopped and disabled"),
        "{reset}"
    );
    let (_, states) = gw.sh(
        "systemctl is-enabled edgecore mapper-modbus; systemctl is-active edgecore mapper-modbus",
    );
    assert_eq!(
        states.split_whitespace().collect::<Vec<_>>(),
        ["disabled", "disabled", "inactive", "inactive"],
        "{states}"
    );
}
