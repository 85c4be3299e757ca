//! The packages as a site runs them: a Debian bookworm made by `mmdebstrap` from Debian's own
//! packages, booted with its own systemd as PID 1 (`systemd-nspawn -b`, a network of its own),
//! and the README's install-and-join section typed in it as root: cloudcore installed, enabled
//! and started, `cloudcore gettoken` as root, edgecore and a mapper installed, `edgecore join`,
//! then the node Ready, `/healthz` ok and a device's values in its DeviceStatus. Then an upgrade
//! by package (`apt-get install --reinstall`) restarts the running edgecore, and `edgecore
//! reset` stops and disables every unit join enabled.
//!
//! Runs as root with `mmdebstrap`, `systemd-nspawn` (systemd-container) and `nsenter` on the
//! machine (`scripts/test` installs them) and a Debian mirror reachable; without them it says
//! so and passes. About a minute and a half.

use sim::containerd::run as ok;
use sim::{bin, eventually, workspace_root};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A booted Debian: its `systemd-nspawn` and the PID of its systemd.
struct Booted {
    nspawn: Child,
    init: u32,
}

impl Booted {
    fn boot(root: &Path, log: &Path) -> Self {
        let nspawn = Command::new("systemd-nspawn")
            .args(["-D"])
            .arg(root)
            .args(["-b", "--register=no", "--keep-unit", "--private-network"])
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
        eventually(60, "systemd running in the container", || {
            let (_, state) = booted.sh("systemctl is-system-running");
            matches!(state.trim(), "running" | "degraded").then_some(())
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

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[test]
fn the_readmes_install_and_join_on_a_booted_debian_ends_with_values_in_devicestatus() {
    if !is_root()
        || !["mmdebstrap", "systemd-nspawn", "nsenter"]
            .iter()
            .all(|t| have(t))
    {
        sim::skip(
            "needs root, mmdebstrap, systemd-nspawn and nsenter (scripts/test installs them)",
        );
        return;
    }
    let bins: PathBuf = bin("edgecore")
        .parent()
        .map(Path::to_path_buf)
        .expect("bins");
    for b in [
        "kectl",
        "cloudcore",
        "mapper-modbus",
        "mapper-serial",
        "mapper-opcua",
        "mapper-ble",
    ] {
        bin(b);
    }
    let work = tempfile::tempdir().expect("tempdir");
    let made = ok(Command::new(workspace_root().join("scripts/package"))
        .args(["--no-build", "--fast", "--bin-dir"])
        .arg(&bins)
        .arg("--out")
        .arg(work.path().join("debs")));
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
    for deb in made.lines() {
        let name = Path::new(deb).file_name().expect("name");
        if !name.to_string_lossy().contains("-dbgsym") {
            std::fs::copy(deb, root.join("root").join(name)).expect("copy");
        }
    }
    let os = Booted::boot(&root, &work.path().join("nspawn.log"));

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

    // The gateway: edgecore and the Modbus mapper, joined in one command.
    let installed =
        os.must("cd /root && apt-get install -y -q ./edgecore_*.deb ./mapper-modbus_*.deb");
    assert!(
        installed.contains("edgecore join --cloud HOST"),
        "{installed}"
    );
    let joined =
        os.must("edgecore join --cloud 127.0.0.1 --token-file /root/token.txt --mapper modbus");
    assert!(
        joined.contains("edgecore.service enabled and (re)started")
            && joined.contains("mapper-modbus.service enabled and (re)started"),
        "{joined}"
    );
    let node = os.must("hostname").trim().to_string();
    let kubeconfig = root.join("var/lib/cloudcore/admin.kubeconfig");
    let kubectl = |args: &[&str]| {
        let out = os
            .in_network(&sim::stack::kubectl_bin())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
            .expect("kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    eventually(60, "the node Ready", || {
        let (_, ready) = kubectl(&[
            "get",
            "node",
            &node,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        (ready.trim() == "True").then_some(())
    });
    let health = eventually(30, "edgecore's /healthz", || {
        // bash's /dev/tcp: the root has no HTTP client.
        let (ok, said) = os.sh(
            "bash -c 'exec 3<>/dev/tcp/127.0.0.1/10360 && printf \"GET /healthz HTTP/1.0\\r\\n\\r\\n\" >&3 && cat <&3'",
        );
        ok.then_some(said)
    });
    assert!(
        health.starts_with("HTTP/1.0 200") && health.trim_end().ends_with("ok"),
        "a freshly joined gateway is healthy: {health}"
    );

    // A device: the README's Modbus TCP example on this node, its PLC the project's simulator.
    let mut plc = os
        .in_network(&bin("modbus-sim"))
        .arg("--oven")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("modbus-sim");
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

    // An upgrade by package restarts the running edgecore: no old binary left running.
    let before = os.must("systemctl show -p MainPID --value edgecore");
    os.must("cd /root && apt-get install -y -q --reinstall ./edgecore_*.deb");
    let after = eventually(30, "edgecore running again after the upgrade", || {
        let (_, pid) =
            os.sh("systemctl is-active -q edgecore && systemctl show -p MainPID --value edgecore");
        let pid = pid.trim().to_string();
        (!pid.is_empty() && pid != "0" && pid != before.trim()).then_some(pid)
    });
    // (Between systemd's fork and the exec, the new process is still systemd's binary.)
    let exe = eventually(30, "the restarted edgecore's binary", || {
        let (_, exe) = os.sh(&format!("readlink /proc/{after}/exe"));
        (exe.trim() != "/usr/lib/systemd/systemd").then_some(exe)
    });
    assert_eq!(
        exe.trim(),
        "/usr/bin/edgecore",
        "not the old, deleted binary"
    );
    let reinstalled = os.must("cd /root && apt-get install -y -q --reinstall ./edgecore_*.deb");
    assert!(
        !reinstalled.contains("edgecore join --cloud HOST"),
        "no join hint on a joined gateway: {reinstalled}"
    );

    // Reset: every unit join enabled, stopped and disabled.
    let reset = os.must("edgecore reset");
    assert!(
        reset.contains("mapper-modbus.service stopped and disabled"),
        "{reset}"
    );
    let (_, states) = os.sh(
        "systemctl is-enabled edgecore mapper-modbus; systemctl is-active edgecore mapper-modbus",
    );
    assert_eq!(
        states.split_whitespace().collect::<Vec<_>>(),
        ["disabled", "disabled", "inactive", "inactive"],
        "{states}"
    );
    let _ = plc.kill();
    let _ = plc.wait();
}
