//! Requests meant to take the server down, each sent while `kubectl` keeps using it: a JSON
//! patch that doubles its object 26 times, a YAML body 100,000 levels deep, a 10 GB
//! `Content-Length`, and clients that send their headers a byte at a time. Each is refused (or
//! cut off) and the server answers the others meanwhile. How long each refusal took is printed,
//! not asserted.

mod common;

use common::{Served, Server};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;

/// A TLS connection to the server as its admin (the admin certificate of the data directory).
async fn connect(s: &Server) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    connect_from(s, [127, 0, 0, 1]).await
}

/// A TLS connection as `user`, whose certificate the API's CA signs (no role binds it).
async fn connect_as(
    s: &Server,
    user: &str,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let pki = s.data().join("pki");
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).expect("CA file");
    let (cert, key) = pki::sign_leaf(&read("ca.crt"), &read("ca.key"), user, None, &[], false, 1)
        .expect("a client certificate");
    connect_with(s, [127, 0, 0, 1], &cert, &key).await
}

/// A refused write whose body comes after its headers (as kubectl sends `create -f`): the
/// server reads the body before it answers, so the client's writes go through and it reads the
/// refusal. (A server that answered and closed first made the client's next write fail with a
/// broken pipe, and kubectl printed that instead of the reason.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_is_answered_after_its_body_not_with_a_reset() {
    let s = Server::start();
    let body = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}"#;
    // Forbidden (no role binds mallory), and a path that names no resource.
    for (path, status, said) in [
        ("/api/v1/namespaces/default/configmaps", "403", "mallory"),
        (
            "/api/v1/namespaces/default/nosuchthings",
            "404",
            "nosuchthings",
        ),
    ] {
        let mut c = connect_as(&s, "mallory").await;
        c.write_all(
            format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .expect("head sent");
        c.flush().await.expect("head flushed");
        // The server has the headers; it decides before the body comes.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (first, rest) = body.split_at(10);
        for part in [first, rest] {
            c.write_all(part).await.expect("the body is taken");
            c.flush().await.expect("the body is taken");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(30), c.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{path}: {answer}"
        );
        assert!(answer.contains(said), "{path}: {answer}");
    }
}

/// The same, from the loopback address `from` (another "host").
async fn connect_from(
    s: &Server,
    from: [u8; 4],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let pki = s.data().join("pki");
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).expect("admin file");
    connect_with(s, from, &read("admin.crt"), &read("admin.key")).await
}

/// A TLS connection from the loopback address `from` with the client certificate and key
/// `cert_pem`, `key_pem`, trusting the API's CA.
async fn connect_with(
    s: &Server,
    from: [u8; 4],
    cert_pem: &str,
    key_pem: &str,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(s.data().join("pki/ca.crt")).expect("ca.crt") {
        roots.add(c.expect("a certificate")).expect("added");
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .expect("certificates");
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_client_auth_cert(certs, key)
    .expect("client certificate");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from((from, 0)))
        .expect("bound");
    let tcp = socket
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], s.port)))
        .await
        .expect("connected");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS")
}

/// Sends `head` and `body`, and returns the status line of the answer and how long it took.
async fn request(s: &Server, head: String, body: &[u8]) -> (String, Duration) {
    let started = Instant::now();
    let mut c = connect(s).await;
    c.write_all(head.as_bytes()).await.expect("head sent");
    let _ = c.write_all(body).await;
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(120), c.read(&mut answer))
        .await
        .expect("an answer")
        .unwrap_or(0);
    let text = String::from_utf8_lossy(&answer[..n]).into_owned();
    (
        text.lines().next().unwrap_or_default().to_string(),
        started.elapsed(),
    )
}

fn still_serves(s: &Server) {
    let out = s.ok(&["get", "configmaps", "-o", "name"]);
    assert!(out.contains("configmap/bomb"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_are_refused_and_others_are_served_meanwhile() {
    let s = Server::start();
    s.ok(&[
        "create",
        "configmap",
        "bomb",
        &format!("--from-literal=a={}", "x".repeat(1024)),
    ]);
    let rss_before = s.rss_kb().expect("the server's VmRSS");

    // 26 copies, each doubling the object: 64 GiB if applied.
    let ops: Vec<String> = (0..26)
        .map(|i| format!(r#"{{"op":"copy","from":"/data","path":"/data/{i}"}}"#))
        .collect();
    let body = format!("[{}]", ops.join(","));
    let (status, took) = request(
        &s,
        format!(
            "PATCH /api/v1/namespaces/default/configmaps/bomb HTTP/1.1\r\nHost: x\r\nContent-Type: application/json-patch+json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        ),
        body.as_bytes(),
    )
    .await;
    eprintln!("JSON patch of 26 doubling copies: {status} in {took:?}");
    eprintln!("  VmRSS {:?} kB", s.rss_kb());
    assert!(status.contains(" 413 "), "{status}");
    still_serves(&s);

    // A YAML body 100,000 levels deep.
    let body = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: deep}}\ndata: {{a: {}1{}}}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let (status, took) = request(
        &s,
        format!(
            "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nContent-Type: application/yaml\r\nContent-Length: {}\r\n\r\n",
            body.len()
        ),
        body.as_bytes(),
    )
    .await;
    eprintln!("YAML body 100,000 levels deep: {status} in {took:?}");
    eprintln!("  VmRSS {:?} kB", s.rss_kb());
    assert!(status.contains(" 400 "), "{status}");
    still_serves(&s);

    // A 10 GB body, declared: refused from the header, before anything is sent.
    let (status, took) = request(
        &s,
        "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n".to_string(),
        b"",
    )
    .await;
    eprintln!("Content-Length of 10 GB: {status} in {took:?}");
    eprintln!("  VmRSS {:?} kB", s.rss_kb());
    assert!(status.contains(" 413 "), "{status}");
    still_serves(&s);

    // CRD schemas: too many nodes, too deep, and
    // a pattern that compiles too large are each refused with the field named; a large but
    // bounded one is taken.
    let crd = |plural: &str, schema: serde_json::Value| {
        serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.bombs.example.com")},
            "spec": {"group": "bombs.example.com", "scope": "Namespaced",
                "names": {"plural": plural, "kind": format!("K{plural}")},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "properties": {"spec": schema}}}}]}
        })
        .to_string()
    };
    let wide = |n: usize| {
        let props: serde_json::Map<String, serde_json::Value> = (0..n)
            .map(|i| (format!("p{i}"), serde_json::json!({"type": "string"})))
            .collect();
        serde_json::json!({"type": "object", "properties": props})
    };
    let mut deep = String::from("{type: string}");
    for _ in 0..70 {
        deep = format!("{{type: object, properties: {{a: {deep}}}}}");
    }
    let deep = format!(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: deeps.bombs.example.com}}\nspec: {{group: bombs.example.com, scope: Namespaced, names: {{plural: deeps, kind: Deep}}, versions: [{{name: v1, served: true, storage: true, schema: {{openAPIV3Schema: {deep}}}}}]}}\n"
    );
    let cases = [
        (
            "60,000 properties",
            "application/json",
            crd("wides", wide(60_000)),
            " 422 ",
            "schema nodes",
        ),
        // The decoders stop at 128 levels before the schema's own bound of 64 schema levels.
        (
            "70 levels deep (YAML)",
            "application/yaml",
            deep,
            " 400 ",
            "recursion limit",
        ),
        (
            "a pattern compiling past 1 MiB",
            "application/json",
            crd(
                "patterns",
                serde_json::json!({"type": "string", "pattern": "\\w{3000}\\w{3000}"}),
            ),
            " 422 ",
            "must compile to at most",
        ),
        (
            "20,000 properties",
            "application/json",
            crd("larges", wide(20_000)),
            " 201 ",
            "",
        ),
    ];
    for (what, ty, body, want, why) in cases {
        let started = Instant::now();
        let mut c = connect(&s).await;
        c.write_all(
            format!(
                "POST /apis/apiextensions.k8s.io/v1/customresourcedefinitions HTTP/1.1\r\nHost: x\r\nContent-Type: {ty}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .expect("head sent");
        c.write_all(body.as_bytes()).await.expect("body sent");
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(120), c.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        let status = answer.lines().next().unwrap_or_default();
        eprintln!(
            "CRD with {what}: {status} in {:?}, VmRSS {:?} kB",
            started.elapsed(),
            s.rss_kb()
        );
        assert!(status.contains(want), "{what}: {answer}");
        assert!(answer.contains(why), "{what}: {answer}");
        still_serves(&s);
    }

    // Eight such bodies at once: each takes ~60 times its size while it is decoded; they share a
    // budget of one largest body (unit-tested in `api::body_budget`; on 2 cores the 2 workers
    // bound it anyway), and the memory is printed.
    let rss_bombs = s.rss_kb().expect("VmRSS");
    let body = crd("wides", wide(60_000));
    let started = Instant::now();
    let bombs = (0..8).map(|_| {
        let (s, body) = (&s, body.clone());
        async move {
            let mut c = connect(s).await;
            let head = format!(
                "POST /apis/apiextensions.k8s.io/v1/customresourcedefinitions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            c.write_all(head.as_bytes()).await.expect("head");
            c.write_all(body.as_bytes()).await.expect("body");
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(120), c.read_to_end(&mut answer)).await;
            String::from_utf8_lossy(&answer).lines().next().unwrap_or_default().to_string()
        }
    });
    let answers = futures_util::future::join_all(bombs).await;
    let rss_after_bombs = s.rss_kb().expect("VmRSS");
    eprintln!(
        "8 CRDs of 60,000 properties at once: {:?} in {:?}, VmRSS {rss_bombs} kB -> {rss_after_bombs} kB",
        answers
            .iter()
            .map(|a| a.split(' ').nth(1).unwrap_or_default())
            .collect::<Vec<_>>(),
        started.elapsed()
    );
    assert!(answers.iter().all(|a| a.contains(" 422 ")), "{answers:?}");
    still_serves(&s);

    // Clients that send their headers a byte at a time are cut off; the rest are served.
    let slow: Vec<_> = (0..50)
        .map(|_| {
            let s = &s;
            async move {
                let mut c = connect(s).await;
                let started = Instant::now();
                for b in b"GET /api/v1/namespaces HTTP/1.1\r\nHost: x\r\nX-Slow: " {
                    if c.write_all(&[*b]).await.is_err() {
                        return started.elapsed();
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                loop {
                    if c.write_all(b"a").await.is_err() {
                        return started.elapsed();
                    }
                    let mut buf = [0u8; 256];
                    if let Ok(Ok(0) | Err(_)) =
                        tokio::time::timeout(Duration::from_millis(200), c.read(&mut buf)).await
                    {
                        return started.elapsed();
                    }
                    assert!(
                        started.elapsed() < Duration::from_secs(120),
                        "a slow client was never cut off"
                    );
                }
            }
        })
        .collect();
    // Meanwhile (while they trickle), kubectl is answered.
    let meanwhile = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        tokio::task::block_in_place(|| still_serves(&s));
    };
    let (cut, ()) = tokio::join!(futures_util::future::join_all(slow), meanwhile);
    eprintln!(
        "50 clients sending headers a byte every 200 ms: cut off after {:?} to {:?}",
        cut.iter().min(),
        cut.iter().max()
    );
    still_serves(&s);

    // 100 connections from one address that never start their TLS handshake: those over the
    // bound per address are closed at once; another address is served meanwhile.
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(
            tokio::net::TcpStream::connect(("127.0.0.1", s.port))
                .await
                .expect("connected"),
        );
    }
    // Each read waits up to 5 s: the server closes the ones over the bound when it accepts
    // them, and keeps the others for the 10 s of the handshake timeout.
    let reads = idle.iter_mut().map(|c| async move {
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    });
    let closed = futures_util::future::join_all(reads)
        .await
        .into_iter()
        .filter(|c| *c)
        .count();
    eprintln!("100 connections that never handshake from one address: {closed} closed at once");
    assert_eq!(closed, 100 - 64, "over the 64 handshakes per address");
    let started = Instant::now();
    let mut other = connect_from(&s, [127, 0, 0, 2]).await;
    other
        .write_all(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("sent");
    let mut answer = String::new();
    let _ = other.read_to_string(&mut answer).await;
    eprintln!(
        "another address meanwhile: {:?} in {:?}",
        answer.lines().next(),
        started.elapsed()
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Memory: none of it made the server hold what it was sent (the patch bomb alone would
    // have needed 64 GiB); what the allocator keeps after the CRD bodies stays below 512 MB.
    let rss_after = s.rss_kb().expect("the server's VmRSS");
    eprintln!("the server's VmRSS: {rss_before} kB before, {rss_after} kB after");
    assert!(
        rss_after < rss_before + 512 * 1024,
        "{rss_before} kB -> {rss_after} kB"
    );
}

/// The API speaks HTTP/2 to a client that asks for it (ALPN `h2`, as browsers, kubectl and
/// kube-rs do) and HTTP/1.1 to one that does not; a hundred watches share one HTTP/2 connection
/// (a page's watches no longer wait for one of the six connections a browser opens over HTTP/1.1).
#[test]
fn http2_is_served_and_a_hundred_watches_share_one_connection() {
    if sim::missing("curl", "curl") {
        return;
    }
    let s = Server::start();
    let pki = s.data().join("pki");
    let curl = |args: &[&str]| {
        let out = std::process::Command::new("curl")
            .args(["-s", "--cacert"])
            .arg(pki.join("ca.crt"))
            .arg("--cert")
            .arg(pki.join("admin.crt"))
            .arg("--key")
            .arg(pki.join("admin.key"))
            .args(args)
            .output()
            .expect("curl runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let url = format!(
        "https://localhost:{}/api/v1/namespaces/default/configmaps",
        s.port
    );
    let said = "%{http_version} %{http_code} %{num_connects}\\n";
    assert_eq!(
        curl(&["--http2", "-o", "/dev/null", "-w", said, &url]),
        "2 200 1\n"
    );
    assert_eq!(
        curl(&["--http1.1", "-o", "/dev/null", "-w", said, &url]),
        "1.1 200 1\n"
    );
    let watch = format!("{url}?watch=1&timeoutSeconds=2");
    let mut args = vec!["--http2", "--parallel", "--parallel-max", "100", "-w", said];
    for _ in 0..100 {
        args.extend(["-o", "/dev/null", watch.as_str()]);
    }
    let out = curl(&args);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 100, "{out}");
    assert!(lines.iter().all(|l| l.starts_with("2 200 ")), "{out}");
    let connections: u32 = lines
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u32>().ok())
        .sum();
    assert!(
        connections <= 2,
        "100 watches over {connections} connections: {out}"
    );
    // kubectl (HTTP/2 as well) goes on.
    assert!(
        s.ok(&["get", "namespaces", "-o", "name"])
            .contains("namespace/default")
    );
}
