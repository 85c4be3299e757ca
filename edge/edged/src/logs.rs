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

/// What of a container's log is asked (the query of `pods/log`).
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub container: Option<String>,
    /// The run before the current one.
    pub previous: bool,
    /// The last this many lines.
    pub tail: Option<usize>,
    /// Only lines written at or after this time (Unix nanoseconds).
    pub since_nanos: Option<i64>,
    /// Each line with the time the runtime wrote it in front (RFC 3339).
    pub timestamps: bool,
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
    let options = Options {
        container: container.map(str::to_string),
        previous,
        tail,
        ..Options::default()
    };
    let opened = open(root, ns, name, uid, &options)?;
    Ok(String::from_utf8_lossy(&opened.text).into_owned())
}

/// A log opened: what it holds now, and where it goes on (for `follow`).
pub struct Opened {
    pub text: Vec<u8>,
    pub follower: Follower,
}

/// A container's log as it is now (as [`read`]), and a [`Follower`] for what is written next.
pub fn open(
    root: &Path,
    ns: &str,
    name: &str,
    uid: Option<&str>,
    options: &Options,
) -> Result<Opened, LogError> {
    let mut text = Vec::new();
    let follower = open_with(root, ns, name, uid, options, &mut |chunk| {
        text.extend_from_slice(&chunk);
        true
    })?;
    Ok(Opened { text, follower })
}

/// The text given to `emit` as it is read, in pieces of about [`PIECE`] bytes (with `tail`,
/// only the last lines, kept until the end: memory in proportion to them, not to the log);
/// `emit` says false to stop reading. Errors that find nothing to read come before any text.
pub fn open_with(
    root: &Path,
    ns: &str,
    name: &str,
    uid: Option<&str>,
    options: &Options,
    emit: &mut dyn FnMut(Vec<u8>) -> bool,
) -> Result<Follower, LogError> {
    let pod = match uid.filter(|u| !u.is_empty()) {
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
    let container = match options.container.as_deref() {
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
    let files =
        log_files(&dir).map_err(|e| (500, format!("cannot read {}: {e}", dir.display())))?;
    let mut attempts: Vec<u32> = files.iter().map(|f| f.0).collect();
    attempts.sort_unstable();
    attempts.dedup();
    let wanted = if options.previous {
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
    // The current file is opened first and read to its end last: nothing written meanwhile
    // is missed, and the follower goes on from there.
    let current = dir.join(format!("{wanted}.log"));
    let mut handle = std::fs::File::open(&current).ok();
    let mut parts: Vec<&(u32, i64, PathBuf)> = files
        .iter()
        .filter(|f| f.0 == wanted && f.1 != i64::MAX)
        .collect();
    parts.sort_by_key(|f| f.1);
    let mut follower = Follower {
        dir,
        attempt: wanted,
        path: current.clone(),
        file: None,
        lines: Lines::default(),
        since_nanos: options.since_nanos,
        timestamps: options.timestamps,
    };
    // Read in blocks; each block's whole lines go out at once, or (tail) into the last ones.
    let mut last: std::collections::VecDeque<LogLine> = Default::default();
    let mut piece = Vec::new();
    let mut stopped = false;
    let mut take = |follower: &mut Follower, block: &[u8], piece: &mut Vec<u8>| -> bool {
        let mut entries = Vec::new();
        follower.lines.feed(block, &mut entries);
        for e in entries.into_iter().filter(|e| follower.wanted(e)) {
            match options.tail {
                Some(0) => {}
                Some(t) => {
                    if last.len() == t {
                        last.pop_front();
                    }
                    last.push_back(e);
                }
                None => follower.format(&e, piece),
            }
        }
        if piece.len() >= PIECE {
            return emit(std::mem::take(piece));
        }
        true
    };
    let mut read_all = |follower: &mut Follower,
                        f: &mut dyn std::io::Read,
                        path: &Path,
                        piece: &mut Vec<u8>|
     -> Result<bool, LogError> {
        let mut block = vec![0u8; PIECE];
        loop {
            let n = f
                .read(&mut block)
                .map_err(|e| (500, format!("cannot read {}: {e}", path.display())))?;
            if n == 0 {
                return Ok(true);
            }
            if !take(follower, &block[..n], piece) {
                return Ok(false);
            }
        }
    };
    for (_, _, path) in parts {
        let mut f = std::fs::File::open(path)
            .map_err(|e| (500, format!("cannot read {}: {e}", path.display())))?;
        if !read_all(&mut follower, &mut f, path, &mut piece)? {
            stopped = true;
            break;
        }
    }
    if !stopped && let Some(f) = handle.as_mut() {
        stopped = !read_all(&mut follower, f, &current, &mut piece)?;
    }
    // A line not ended yet (no newline, or a partial line) waits in the follower for its end.
    for e in &last {
        follower.format(e, &mut piece);
    }
    if !stopped && !piece.is_empty() {
        emit(piece);
    }
    if !options.previous {
        // That run goes on: followed from where this read ended.
        follower.file = handle;
    }
    Ok(follower)
}

/// About how many bytes are read, and given out, at a time.
pub const PIECE: usize = 64 * 1024;

/// The log files of a container's directory: (attempt, rotation order, path); the current
/// file of an attempt sorts after its rotated parts (`i64::MAX`).
fn log_files(dir: &Path) -> std::io::Result<Vec<(u32, i64, PathBuf)>> {
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|d| {
            let f = d.file_name().to_string_lossy().into_owned();
            let (attempt, rest) = f.split_once(".log")?;
            let attempt: u32 = attempt.parse().ok()?;
            let order = match rest.strip_prefix('.') {
                Some(ts) => ts.parse().ok()?,
                None if rest.is_empty() => i64::MAX,
                None => return None,
            };
            Some((attempt, order, d.path()))
        })
        .collect())
}

/// One line of the log: when the runtime wrote it, and its text (partial lines joined).
struct LogLine {
    time: String,
    text: String,
}

/// CRI log lines (`TIME STREAM P|F TEXT`) from bytes as they come: a line not ended by a
/// newline waits for the rest, a partial (`P`) line for the line that ends it.
#[derive(Default)]
struct Lines {
    pending: Vec<u8>,
    partial: Option<LogLine>,
}

impl Lines {
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<LogLine>) {
        self.pending.extend_from_slice(bytes);
        let Some(last) = self.pending.iter().rposition(|b| *b == b'\n') else {
            return;
        };
        let complete: Vec<u8> = self.pending.drain(..=last).collect();
        for line in String::from_utf8_lossy(&complete).lines() {
            let mut parts = line.splitn(4, ' ');
            let (time, _stream, tag) = (parts.next(), parts.next(), parts.next());
            let msg = parts.next().unwrap_or_default();
            let entry = self.partial.get_or_insert_with(|| LogLine {
                time: time.unwrap_or_default().to_string(),
                text: String::new(),
            });
            entry.text.push_str(msg);
            if tag != Some("P")
                && let Some(e) = self.partial.take()
            {
                out.push(e);
            }
        }
    }
}

/// Where a followed log goes on: the file of the attempt read, and what it has seen of it.
pub struct Follower {
    dir: PathBuf,
    attempt: u32,
    path: PathBuf,
    file: Option<std::fs::File>,
    lines: Lines,
    since_nanos: Option<i64>,
    timestamps: bool,
}

/// What a look at a followed log found.
#[derive(Debug, PartialEq, Eq)]
pub enum Followed {
    /// New text.
    Text(Vec<u8>),
    /// Nothing new.
    Nothing,
    /// The run ended: a newer attempt began or the pod's logs went (`previous` logs end at once).
    Ended,
}

impl Follower {
    fn wanted(&self, e: &LogLine) -> bool {
        self.since_nanos
            .is_none_or(|since| nanos_of(&e.time).is_none_or(|t| t >= since))
    }

    fn format(&self, e: &LogLine, out: &mut Vec<u8>) {
        if self.timestamps {
            out.extend_from_slice(e.time.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(e.text.as_bytes());
        out.push(b'\n');
    }

    /// What was written since the last look. A rotated file is read to its end before the
    /// new one; a newer attempt (the container restarted) ends the run being followed.
    pub fn poll(&mut self) -> Followed {
        let mut bytes = Vec::new();
        if let Some(f) = self.file.as_mut() {
            let _ = std::io::Read::read_to_end(f, &mut bytes);
        }
        if bytes.is_empty() {
            if self.file.is_none() && self.attempt_over() {
                return Followed::Ended;
            }
            // Rotated: the path is another file now (or none yet).
            let now = std::fs::metadata(&self.path).ok().map(|m| inode(&m));
            let open = self
                .file
                .as_ref()
                .and_then(|f| f.metadata().ok())
                .map(|m| inode(&m));
            if now.is_some() && now != open {
                self.file = std::fs::File::open(&self.path).ok();
                if let Some(f) = self.file.as_mut() {
                    let _ = std::io::Read::read_to_end(f, &mut bytes);
                }
            } else if self.attempt_over() {
                return Followed::Ended;
            }
        }
        if bytes.is_empty() {
            return Followed::Nothing;
        }
        let mut entries = Vec::new();
        self.lines.feed(&bytes, &mut entries);
        let mut out = Vec::new();
        for e in entries.iter().filter(|e| self.wanted(e)) {
            self.format(e, &mut out);
        }
        if out.is_empty() {
            Followed::Nothing
        } else {
            Followed::Text(out)
        }
    }

    /// Whether the followed run is over: a newer attempt's file exists, or the directory went.
    fn attempt_over(&self) -> bool {
        match log_files(&self.dir) {
            Ok(files) => files.iter().any(|f| f.0 > self.attempt),
            Err(_) => true,
        }
    }

    /// Follows no further (a `previous` log: its run is over).
    pub fn is_done(&self) -> bool {
        self.file.is_none() && self.attempt_over()
    }
}

fn inode(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

/// A CRI log line's time (RFC 3339, as containerd writes it) as Unix nanoseconds.
fn nanos_of(time: &str) -> Option<i64> {
    let t =
        time::OffsetDateTime::parse(time, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos()).ok()
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

    #[test]
    fn a_follower_sees_appends_partial_lines_rotation_and_the_end_of_its_run() {
        use std::io::Write;
        let root = tempfile::tempdir().expect("tempdir");
        let c = root.path().join("default_m_u1/main");
        std::fs::create_dir_all(&c).expect("mkdir");
        let current = c.join("0.log");
        std::fs::write(&current, "2026-01-01T00:00:00Z stdout F one\n").expect("w");
        let options = Options {
            timestamps: true,
            ..Options::default()
        };
        let mut opened = open(root.path(), "default", "m", Some("u1"), &options).expect("open");
        assert_eq!(opened.text, b"2026-01-01T00:00:00Z one\n");
        let f = &mut opened.follower;
        assert_eq!(f.poll(), Followed::Nothing);
        let mut w = std::fs::OpenOptions::new()
            .append(true)
            .open(&current)
            .expect("append");
        // Half a line, then a partial line, then its end.
        write!(w, "2026-01-01T00:00:01Z stdout P tw").expect("w");
        assert_eq!(f.poll(), Followed::Nothing, "no newline yet");
        writeln!(w, "o-").expect("w");
        assert_eq!(f.poll(), Followed::Nothing, "a partial line waits");
        writeln!(w, "2026-01-01T00:00:02Z stdout F three").expect("w");
        assert_eq!(
            f.poll(),
            Followed::Text(b"2026-01-01T00:00:01Z two-three\n".to_vec())
        );
        // Rotated as edged does: renamed, then a new file at the same path.
        writeln!(w, "2026-01-01T00:00:03Z stdout F four").expect("w");
        drop(w);
        std::fs::rename(&current, c.join("0.log.100")).expect("rotate");
        std::fs::write(&current, "2026-01-01T00:00:04Z stdout F five\n").expect("w");
        let mut seen = Vec::new();
        for _ in 0..3 {
            if let Followed::Text(t) = f.poll() {
                seen.extend(t);
            }
        }
        assert_eq!(
            String::from_utf8_lossy(&seen),
            "2026-01-01T00:00:03Z four\n2026-01-01T00:00:04Z five\n"
        );
        // The container restarts: the next attempt's file ends this run once it is read out.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&current)
            .and_then(|mut w| writeln!(w, "2026-01-01T00:00:05Z stdout F six"))
            .expect("w");
        std::fs::write(c.join("1.log"), "2026-01-01T00:00:06Z stdout F next run\n").expect("w");
        assert_eq!(
            f.poll(),
            Followed::Text(b"2026-01-01T00:00:05Z six\n".to_vec())
        );
        assert_eq!(f.poll(), Followed::Ended);
        // The previous run's log is over at once.
        let prev = Options {
            previous: true,
            ..Options::default()
        };
        let mut opened = open(root.path(), "default", "m", Some("u1"), &prev).expect("previous");
        assert!(String::from_utf8_lossy(&opened.text).ends_with("five\nsix\n"));
        assert!(opened.follower.is_done());
        assert_eq!(opened.follower.poll(), Followed::Ended);
    }

    #[test]
    fn since_keeps_the_lines_written_from_that_instant_in_any_offset() {
        let root = tempfile::tempdir().expect("tempdir");
        let c = root.path().join("default_m_u1/main");
        std::fs::create_dir_all(&c).expect("mkdir");
        std::fs::write(
            c.join("0.log"),
            "2026-01-01T00:00:00.5Z stdout F early\n\
             2026-01-01T01:00:01+01:00 stdout F same instant as 00:00:01Z\n\
             2026-01-01T00:00:02.000000001Z stderr F late\n",
        )
        .expect("w");
        let since = nanos_of("2026-01-01T00:00:01Z");
        assert!(since.is_some());
        let options = Options {
            since_nanos: since,
            ..Options::default()
        };
        let opened = open(root.path(), "default", "m", None, &options).expect("open");
        assert_eq!(
            String::from_utf8_lossy(&opened.text),
            "same instant as 00:00:01Z\nlate\n"
        );
        let tail = Options {
            since_nanos: since,
            tail: Some(1),
            ..Options::default()
        };
        let opened = open(root.path(), "default", "m", None, &tail).expect("open");
        assert_eq!(String::from_utf8_lossy(&opened.text), "late\n");
    }

    #[test]
    fn a_large_log_goes_out_in_pieces_and_stops_when_told() {
        let root = tempfile::tempdir().expect("tempdir");
        let c = root.path().join("default_m_u1/main");
        std::fs::create_dir_all(&c).expect("mkdir");
        let line = format!("2026-01-01T00:00:00Z stdout F {}\n", "x".repeat(90));
        std::fs::write(c.join("0.log.1"), line.repeat(2000)).expect("w");
        std::fs::write(c.join("0.log"), line.repeat(2000)).expect("w");
        let mut pieces = Vec::new();
        let options = Options::default();
        open_with(root.path(), "default", "m", None, &options, &mut |p| {
            pieces.push(p.len());
            true
        })
        .expect("read");
        assert!(pieces.len() > 2, "{pieces:?}");
        assert!(pieces.iter().all(|n| *n <= 2 * PIECE), "{pieces:?}");
        assert_eq!(pieces.iter().sum::<usize>(), 4000 * 91);
        // Told to stop: nothing more is read or given.
        let mut given = 0;
        open_with(root.path(), "default", "m", None, &options, &mut |_| {
            given += 1;
            false
        })
        .expect("read");
        assert_eq!(given, 1);
        // The tail of it: only those lines.
        let tail = Options {
            tail: Some(3),
            ..Options::default()
        };
        let opened = open(root.path(), "default", "m", None, &tail).expect("tail");
        assert_eq!(opened.text.len(), 3 * 91);
    }
}
