//! `apiserver`: the embedded API of `cloudcore` on its own, serving a Kubernetes-compatible API
//! from one SQLite file with no cluster: for the crate's own conformance tests (`tests/`), and
//! for trying `kubectl` or a controller against it.
//!
//! ```sh
//! apiserver --data-dir /tmp/api --listen 127.0.0.1:6443 --install crds.yaml
//! kubectl --kubeconfig /tmp/api/admin.kubeconfig get crd
//! ```

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "apiserver",
    about = "A Kubernetes-compatible API served from one SQLite file (cloudcore's embedded API on its own)"
)]
struct Args {
    /// Where the database, the certificates and `admin.kubeconfig` are kept.
    #[arg(long, default_value = "apiserver-data")]
    data_dir: PathBuf,
    /// The HTTPS listener.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: std::net::SocketAddr,
    /// YAML files of objects (CRDs) created at start when absent, or updated when their spec
    /// differs.
    #[arg(long)]
    install: Vec<PathBuf>,
    /// Events kept for watches to resume from.
    #[arg(long)]
    watch_history: Option<usize>,
    /// Largest request body accepted (413 beyond).
    #[arg(long)]
    max_body_bytes: Option<usize>,
    /// Keep the objects in etcd instead of SQLite: the members' client URLs, comma-separated
    /// (`http://127.0.0.1:2379,http://127.0.0.1:22379`).
    #[arg(long, value_delimiter = ',')]
    etcd: Vec<String>,
    /// The etcd keys' prefix.
    #[arg(long, default_value = "/cloudcore/")]
    etcd_prefix: String,
    /// TLS to etcd (`https://` endpoints): the CA of etcd's certificate (PEM file).
    #[arg(long)]
    etcd_ca: Option<PathBuf>,
    /// This server's client certificate and key for etcd (PEM files).
    #[arg(long, requires = "etcd_key")]
    etcd_cert: Option<PathBuf>,
    #[arg(long, requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
}

fn objects(files: &[PathBuf]) -> Result<Vec<serde_json::Value>, String> {
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("--install {}: {e}", file.display()))?;
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            use serde::Deserialize;
            let v = serde_json::Value::deserialize(doc)
                .map_err(|e| format!("--install {}: {e}", file.display()))?;
            if !v.is_null() {
                out.push(v);
            }
        }
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args = Args::parse();
    rt::bootstrap::init_tracing("info");
    let install = match objects(&args.install) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("apiserver: {e}");
            return ExitCode::from(2);
        }
    };
    let read = |p: &Option<PathBuf>| -> Result<Option<String>, String> {
        p.as_ref()
            .map(|p| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display())))
            .transpose()
    };
    let tls = match (
        read(&args.etcd_ca),
        read(&args.etcd_cert),
        read(&args.etcd_key),
    ) {
        (Ok(Some(ca)), Ok(cert), Ok(key)) => Some(apiserver::EtcdTls { ca, cert, key }),
        (Ok(None), Ok(None), Ok(None)) => None,
        (Ok(None), _, _) => {
            eprintln!("apiserver: --etcd-cert and --etcd-key need --etcd-ca");
            return ExitCode::from(2);
        }
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            eprintln!("apiserver: cannot read {e}");
            return ExitCode::from(2);
        }
    };
    let defaults = apiserver::Config::default();
    let config = apiserver::Config {
        data_dir: args.data_dir,
        listen: args.listen,
        history: args.watch_history.unwrap_or(defaults.history),
        max_body: args.max_body_bytes.unwrap_or(defaults.max_body),
        install,
        etcd: (!args.etcd.is_empty()).then(|| apiserver::EtcdOptions {
            endpoints: args.etcd.clone(),
            prefix: args.etcd_prefix.clone(),
            tls: tls.clone(),
            ..apiserver::EtcdOptions::default()
        }),
        ..defaults
    };
    rt::bootstrap::run(
        "apiserver",
        rt::bootstrap::Threads::PerCore,
        |cancel| async move {
            let running = apiserver::start(config).await?;
            eprintln!(
                "apiserver: API at {}; use it with: kubectl --kubeconfig {} get crd",
                running.url,
                running.kubeconfig.display()
            );
            cancel.cancelled().await;
            tracing::info!("stopping");
            running.shutdown(Duration::from_secs(5)).await;
            anyhow::Ok(())
        },
    )
}
