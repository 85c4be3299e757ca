//! Private files: the data directories and databases of every component hold secrets (Secrets
//! sent to pods, keys, tokens, twins), so they are made readable by their owner only, whatever
//! the umask, and made so again at every start (a data directory from an older version, or
//! copied in by hand, is corrected).

use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Makes `dir` (with its missing parents) and sets it to 0700.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Makes the files of the SQLite database at `path` 0600: the database is created empty when
/// missing (SQLite gives the `-wal` and `-shm` files it makes the mode of the database file),
/// and the database, `-wal` and `-shm` files that exist are set to 0600.
pub fn private_database(path: &Path) -> io::Result<()> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    for file in [
        path.to_path_buf(),
        beside(path, "-wal"),
        beside(path, "-shm"),
    ] {
        match std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777
    }

    #[test]
    fn directories_and_databases_become_private_even_when_they_were_not() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a/data");
        private_dir(&dir).expect("made");
        assert_eq!(mode(&dir), 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("opened");
        private_dir(&dir).expect("again");
        assert_eq!(mode(&dir), 0o700, "an existing directory is corrected");

        let db = dir.join("x.db");
        private_database(&db).expect("created");
        assert_eq!(mode(&db), 0o600);
        let wal = dir.join("x.db-wal");
        std::fs::write(&wal, b"").expect("wal");
        std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o644)).expect("open");
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).expect("open");
        private_database(&db).expect("corrected");
        assert_eq!((mode(&db), mode(&wal)), (0o600, 0o600));
    }
}
