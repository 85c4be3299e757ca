//! A real containerd (Debian's 1.6, its CRI plugin, runc) started as root with its own state
//! directory and socket, images made here with umoci (Debian's static busybox; the project's
//! binaries through `scripts/mapper-image`), and a real registry (`docker-registry`, Debian's
//! distribution 2.8) on loopback that `skopeo` pushes to; pods without `hostNetwork` get an
//! address on a CNI bridge of the test's own (Debian's `containernetworking-plugins`). Needs
//! `apt-get install containerd runc umoci busybox-static docker-registry skopeo
//! containernetworking-plugins iproute2` (`.ci/run` installs them).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// As containerd names it (CRI normalizes `edged-test/busybox:1` to this).
pub const IMAGE: &str = "docker.io/edged-test/busybox:1";

pub use crate::run;

/// Panics naming the Debian package when `tool` is not installed.
pub fn need(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).exists()))
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is not installed: apt-get install {package} (.ci/run does)"
    );
}

/// containerd with its own root, state and socket under `dir`, stopped (with every container it
/// runs) on drop.
pub struct Containerd {
    child: Child,
    dir: PathBuf,
    pub socket: PathBuf,
    /// The CNI bridge of pods without `hostNetwork`, and its subnet.
    pub bridge: String,
    pub subnet: String,
}

/// Where Debian's `containernetworking-plugins` puts the CNI plugins.
pub const CNI_BIN: &str = "/usr/lib/cni";

/// A bridge name and a /24 of its own for each containerd of this process (tests of one binary
/// run at once), so that their pods' networks do not meet.
fn network() -> (String, String) {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 5;
    let n = (std::process::id() % 50) * 5 + k;
    (format!("kbt{n}"), format!("10.213.{n}.0/24"))
}

impl Containerd {
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, None)
    }

    /// With `registry` (`host:port`) reached over plain HTTP, as a registry on loopback is.
    pub fn start_with(dir: &Path, registry: Option<&str>) -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let root = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            == Some("0");
        assert!(root, "this test runs containerd, which needs root");
        assert!(
            Path::new(CNI_BIN).join("bridge").exists(),
            "the CNI plugins are not installed: apt-get install containernetworking-plugins (.ci/run does)"
        );
        for (tool, package) in [
            ("containerd", "containerd"),
            ("runc", "runc"),
            ("umoci", "umoci"),
            ("busybox", "busybox-static"),
        ] {
            need(tool, package);
        }
        std::fs::create_dir_all(dir).expect("containerd's directory");
        let socket = dir.join("containerd.sock");
        let config = dir.join("containerd.toml");
        // Pods without hostNetwork: a bridge with host-local addresses, nothing routed out.
        let (bridge, subnet) = network();
        let cni = dir.join("cni");
        std::fs::create_dir_all(&cni).expect("cni dir");
        std::fs::write(
            cni.join("10-edged-test.conflist"),
            serde_json::json!({
                "cniVersion": "0.4.0",
                "name": "edged-test",
                "plugins": [{
                    "type": "bridge",
                    "bridge": bridge,
                    "isGateway": true,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": subnet}]],
                        "dataDir": dir.join("cni-ipam"),
                    },
                }],
            })
            .to_string(),
        )
        .expect("write the CNI config");
        // restrict_oom_score_adj: the sandbox's -998 cannot be set inside a container (CI, this
        // machine): runc then fails with "can't get final child's PID from pipe". The native
        // snapshotter works on any filesystem (overlayfs cannot stack on an overlay root).
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n[grpc]\n  address = \"{sock}\"\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{IMAGE}\"\n  restrict_oom_score_adj = true\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"native\"\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"{CNI_BIN}\"\n  conf_dir = \"{cni}\"\n{mirror}",
                root = dir.join("root").display(),
                state = dir.join("state").display(),
                sock = socket.display(),
                cni = cni.display(),
                mirror = registry.map_or(String::new(), |r| format!(
                    "[plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"{r}\"]\n  endpoint = [\"http://{r}\"]\n"
                )),
            ),
        )
        .expect("write containerd config");
        let mut c = Self {
            child: Self::spawn(dir),
            dir: dir.to_path_buf(),
            socket,
            bridge,
            subnet,
        };
        c.wait_up();
        c
    }

    fn spawn(dir: &Path) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("containerd.log"))
            .expect("log");
        Command::new("containerd")
            .arg("--config")
            .arg(dir.join("containerd.toml"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start containerd")
    }

    /// Stops containerd (SIGTERM; its containers keep running under their shims) and starts it
    /// again.
    pub fn restart(&mut self, while_down: impl FnOnce()) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        while_down();
        self.child = Self::spawn(&self.dir);
        self.wait_up();
    }

    fn wait_up(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Command::new("ctr")
            .args(["--address", &self.socket.display().to_string(), "version"])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            assert!(Instant::now() < deadline, "containerd did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn ctr(&self, args: &[&str]) -> String {
        let mut cmd = Command::new("ctr");
        cmd.args([
            "--address",
            &self.socket.display().to_string(),
            "-n",
            "k8s.io",
        ]);
        cmd.args(args);
        run(&mut cmd)
    }

    /// A busybox image made with umoci, imported as [`IMAGE`] (also the sandbox image).
    pub fn import_busybox(&self) {
        let d = self.dir.join("image");
        let layout = d.join("layout");
        let bundle = d.join("bundle");
        let img = format!("{}:t", layout.display());
        run(Command::new("umoci")
            .args(["init", "--layout"])
            .arg(&layout));
        run(Command::new("umoci").args(["new", "--image", &img]));
        run(Command::new("umoci")
            .args(["unpack", "--image", &img])
            .arg(&bundle));
        let bin = bundle.join("rootfs/bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        std::fs::copy("/bin/busybox", bin.join("busybox"))
            .or_else(|_| std::fs::copy("/usr/bin/busybox", bin.join("busybox")))
            .expect("copy busybox");
        for tool in ["sh", "sleep", "echo", "cat"] {
            std::os::unix::fs::symlink("busybox", bin.join(tool)).expect("symlink");
        }
        run(Command::new("umoci")
            .args(["repack", "--image", &img])
            .arg(&bundle));
        run(Command::new("umoci").args([
            "config",
            "--image",
            &img,
            "--config.entrypoint",
            "/bin/sleep",
            "--config.cmd",
            "infinity",
        ]));
        let tar = d.join("image.tar");
        run(Command::new("tar")
            .arg("-C")
            .arg(&layout)
            .arg("-cf")
            .arg(&tar)
            .arg("."));
        self.import(&tar, IMAGE);
    }

    /// Imports an OCI archive as `name`.
    pub fn import(&self, archive: &Path, name: &str) {
        self.ctr(&[
            "images",
            "import",
            "--snapshotter",
            "native",
            "--index-name",
            name,
            &archive.display().to_string(),
        ]);
    }

    pub fn containers(&self) -> Vec<String> {
        self.ctr(&["containers", "ls", "-q"])
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// Kills the containerd shims that serve the containerd listening on `socket`.
fn kill_shims(socket: &Path) {
    let socket = socket.display().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let shim = args
            .first()
            .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"));
        if shim && args.contains(&socket.as_bytes()) {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Whatever still runs (a failed test) is killed, then containerd; its mounts go.
        if let Ok(tasks) = Command::new("ctr")
            .args([
                "--address",
                &self.socket.display().to_string(),
                "-n",
                "k8s.io",
            ])
            .args(["tasks", "ls", "-q"])
            .output()
        {
            for id in String::from_utf8_lossy(&tasks.stdout).lines() {
                let _ = Command::new("ctr")
                    .args([
                        "--address",
                        &self.socket.display().to_string(),
                        "-n",
                        "k8s.io",
                    ])
                    .args(["tasks", "kill", "-s", "SIGKILL", id])
                    .output();
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The shims of the killed tasks wait for containerd to delete them, which it no longer
        // will: without this each test left a shim per pod running.
        kill_shims(&self.socket);
        let root = self.dir.display().to_string();
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") {
            let mut points: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split_whitespace().nth(1))
                .filter(|p| p.starts_with(&root))
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for p in points {
                let _ = Command::new("umount").args(["-l", p]).output();
            }
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
    }
}

/// A registry v2 (`docker-registry`) on a free loopback port, its storage in `dir`; stopped on
/// drop.
pub struct Registry {
    child: Child,
    pub address: String,
}

impl Registry {
    pub fn start(dir: &Path) -> Self {
        need("docker-registry", "docker-registry");
        need("skopeo", "skopeo");
        let port = crate::free_port();
        let address = format!("127.0.0.1:{port}");
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\nhttp:\n  addr: {address}\n",
                dir.join("storage").display()
            ),
        )
        .expect("registry config");
        let log = std::fs::File::create(dir.join("registry.log")).expect("log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start docker-registry");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&address).is_err() {
            assert!(Instant::now() < deadline, "docker-registry did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        Self { child, address }
    }

    /// Pushes an OCI archive as `repo:tag`; returns the image reference to pull.
    pub fn push(&self, archive: &Path, repo_tag: &str) -> String {
        let image = format!("{}/{repo_tag}", self.address);
        run(Command::new("skopeo")
            .args(["copy", "--dest-tls-verify=false"])
            .arg(format!("oci-archive:{}", archive.display()))
            .arg(format!("docker://{image}")));
        image
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An OCI archive of one of the workspace's binaries from `bins` (`scripts/mapper-image` with
/// that binary, no build), written to `out`.
pub fn binary_image(bins: &Path, name: &str, tag: &str, out: &Path) -> PathBuf {
    need("umoci", "umoci");
    let script = crate::workspace_root().join("scripts/mapper-image");
    let printed = run(Command::new("bash")
        .arg(&script)
        .args([name, tag])
        .env("MAPPER_IMAGE_EXE", bins.join(name))
        .env("MAPPER_IMAGE_OUT", out));
    PathBuf::from(printed.trim())
}
