//! Container logs as `kectl logs` reads them: the CRI files the runtime writes under
//! `{podLogDir}/{ns}_{name}_{uid}/{container}/{attempt}.log` (and their rotated parts), each line
//! `TIME STREAM P|F TEXT`; partial lines (`P`) are joined to the next.

use std::path::{Path, PathBuf};

/// What went wrong: an HTTP status and a message that names what is missing.
pub type LogError = (u16, String);

/// The directory the runtime writes a pod's logs to (CRI's `log_directory` of its sandbox).
pub fn pod_dir(root: &Path, ns: &str, name: &str, uid: &str) -> PathBuf {
    root.join(format!("{ns}_{name}_{uid}"))
}

/// The newest log directory of pod `ns/name`, for a pod edged no longer runs.
fn newest_pod_dir(root: &Path, ns: &str, name: &str) -> Result<PathBuf, LogError> {
    let prefix = format!("{ns}_{name}_");
    std::fs::read_dir(root)
        .map_err(|e| (500, format!("cannot read {}: {e}", root.display())))?
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with(&prefix))
        .max_by_key(|d| d.metadata().and_then(|m| m.modified()).ok())
        .map(|d| d.path())
        .ok_or_else(|| (404, format!("no logs of pod {ns}/{name} on this node")))
}

/// The text of a container's log: the current attempt's (or with `previous` the one before),
/// its rotated parts first; the last `tail` lines when given. `uid` is the running pod's, when
/// edged runs it (else the newest directory of that name is read).
pub fn read(
    root: &Path,
    ns: &str,
    name: &str,
    uid: Option<&str>,
    container: Option<&str>,
    previous: bool,
    tail: Option<usize>,
) -> Result<String, LogError> {
    let pod = match uid {
        Some(uid) => pod_dir(root, ns, name, uid),
        None => newest_pod_dir(root, ns, name)?,
    };
    let containers: Vec<String> = std::fs::read_dir(&pod)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => (404, format!("no logs of pod {ns}/{name} yet")),
            _ => (500, format!("cannot read {}: {e}", pod.display())),
        })?
        .flatten()
        .filter(|d| d.path().is_dir())
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .collect();
    let container = match container {
        Some(c) if containers.iter().any(|x| x == c) => c.to_string(),
        Some(c) => {
            return Err((
                404,
                format!(
                    "pod {ns}/{name} has no container {c} (it has: {})",
                    containers.join(", ")
                ),
            ));
        }
        None if containers.len() == 1 => containers[0].clone(),
        None => {
            return Err((
                400,
                format!(
                    "pod {ns}/{name} has several containers; name one of: {}",
                    containers.join(", ")
                ),
            ));
        }
    };
    let dir = pod.join(&container);
    let mut files: Vec<(u32, i64, PathBuf)> = std::fs::read_dir(&dir)
        .map_err(|e| (500, format!("cannot read {}: {e}", dir.display())))?
        .flatten()
        .filter_map(|d| {
            let f = d.file_name().to_string_lossy().into_owned();
            let (attempt, rest) = f.split_once(".log")?;
            let attempt: u32 = attempt.parse().ok()?;
            // The current file sorts after its rotated parts.
            let order = match rest.strip_prefix('.') {
                Some(ts) => ts.parse().ok()?,
                None if rest.is_empty() => i64::MAX,
                None => return None,
            };
            Some((attempt, order, d.path()))
        })
        .collect();
    let mut attempts: Vec<u32> = files.iter().map(|f| f.0).collect();
    attempts.sort_unstable();
    attempts.dedup();
    let wanted = if previous {
        attempts.iter().rev().nth(1).copied().ok_or_else(|| {
            (
                404,
                format!("container {container} of pod {ns}/{name} has no previous run"),
            )
        })?
    } else {
        attempts.last().copied().ok_or_else(|| {
            (
                404,
                format!("container {container} of pod {ns}/{name} has no log yet"),
            )
        })?
    };
    files.retain(|f| f.0 == wanted);
    files.sort_by_key(|f| f.1);
    let mut out = Vec::new();
    let mut partial = String::new();
    for (_, _, path) in files {
        let text = std::fs::read(&path)
            .map_err(|e| (500, format!("cannot read {}: {e}", path.display())))?;
        for line in String::from_utf8_lossy(&text).lines() {
            let mut parts = line.splitn(4, ' ');
            let (_time, _stream, tag) = (parts.next(), parts.next(), parts.next());
            let msg = parts.next().unwrap_or_default();
            partial.push_str(msg);
            if tag != Some("P") {
                out.push(std::mem::take(&mut partial));
            }
        }
    }
    if !partial.is_empty() {
        out.push(partial);
    }
    let start = tail.map_or(0, |t| out.len().saturating_sub(t));
    let mut text = out[start..].join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parts_attempts_and_errors() {
        let root = tempfile::tempdir().expect("tempdir");
        let c = root.path().join("default_m_u1/main");
        std::fs::create_dir_all(&c).expect("mkdir");
        std::fs::write(c.join("0.log"), "2026-01-01T00:00:00Z stdout F first run\n").expect("w");
        std::fs::write(
            c.join("1.log.100"),
            "2026-01-01T00:00:01Z stdout F a\n2026-01-01T00:00:01Z stdout P b-\n",
        )
        .expect("w");
        std::fs::write(
            c.join("1.log"),
            "2026-01-01T00:00:02Z stderr F c\n2026-01-01T00:00:03Z stdout F d\n",
        )
        .expect("w");
        let read = |prev, tail| read(root.path(), "default", "m", None, None, prev, tail);
        assert_eq!(read(false, None).expect("log"), "a\nb-c\nd\n");
        assert_eq!(read(false, Some(1)).expect("log"), "d\n");
        assert_eq!(read(true, None).expect("log"), "first run\n");
        let e = super::read(root.path(), "default", "m", None, Some("x"), false, None)
            .expect_err("no x");
        assert_eq!(e.0, 404);
        assert!(e.1.contains("has no container x (it has: main)"), "{}", e.1);
        let e = super::read(root.path(), "default", "other", None, None, false, None)
            .expect_err("none");
        assert_eq!(
            e,
            (404, "no logs of pod default/other on this node".to_string())
        );
        // With the running pod's uid, its own directory, not another of the same name.
        let newer = root.path().join("default_m_u0/main");
        std::fs::create_dir_all(&newer).expect("mkdir");
        std::fs::write(
            newer.join("0.log"),
            "2026-01-01T00:00:09Z stdout F old pod\n",
        )
        .expect("w");
        let mine = super::read(root.path(), "default", "m", Some("u1"), None, false, None);
        assert_eq!(mine.expect("log"), "a\nb-c\nd\n");
        let e = super::read(root.path(), "default", "m", Some("u9"), None, false, None)
            .expect_err("not started");
        assert_eq!(e, (404, "no logs of pod default/m yet".to_string()));
    }
}
