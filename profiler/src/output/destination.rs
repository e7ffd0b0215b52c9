//! Where a recording's files go: checked before sampling starts, and never lost at the end.
//!
//! [`probe`] runs before anything is recorded. It opens the path for writing the way the final
//! write will (creating the file, and removing it again, when it did not exist), so a missing
//! directory, a directory given as the file, a read-only filesystem or missing permissions are
//! reported in one line before the user waits through a whole recording.
//!
//! [`save`] writes the finished bytes. If that still fails (disk full, the directory removed
//! meanwhile), the same bytes go to a new file in the temporary directory and the caller is
//! told where: a recording, which cannot be repeated, is never dropped because of its output.

use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

/// A path that cannot take the output: bad usage, reported before sampling (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("cannot write {what} to {}: {error}: {fix}", path.display())]
pub(crate) struct Unwritable {
    /// "the profile", "the stats".
    pub what: &'static str,
    pub path: PathBuf,
    /// Not a `source`: the message already says it, once.
    pub error: std::io::Error,
    pub fix: String,
}

/// Checks that `path` can be created or overwritten, without changing anything: a file that
/// did not exist is removed again, an existing one is opened without truncating it.
pub(crate) fn probe(path: &Path, what: &'static str) -> Result<(), Unwritable> {
    let fail = |error: std::io::Error| Unwritable {
        what,
        path: path.to_path_buf(),
        fix: fix_for(path, &error),
        error,
    };
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(fail(std::io::Error::from_raw_os_error(libc::EISDIR))),
        // A FIFO or a device (`/dev/stdout`): opening it may block or have effects, so ask
        // the kernel about access instead.
        Ok(meta) if !meta.is_file() => nix::unistd::access(path, nix::unistd::AccessFlags::W_OK)
            .map_err(|errno| fail(std::io::Error::from_raw_os_error(errno as i32))),
        Ok(_) => OpenOptions::new()
            .write(true)
            .open(path)
            .map(drop)
            .map_err(fail),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            match OpenOptions::new().write(true).create_new(true).open(path) {
                Ok(file) => {
                    drop(file);
                    std::fs::remove_file(path).map_err(fail)
                }
                Err(e) => Err(fail(e)),
            }
        }
        Err(e) => Err(fail(e)),
    }
}

/// What to do about `err` when writing `path`.
fn fix_for(path: &Path, err: &std::io::Error) -> String {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    match err.raw_os_error() {
        Some(libc::ENOENT) => format!(
            "the directory {} does not exist: create it (`mkdir -p {}`) or write elsewhere",
            dir.display(),
            dir.display()
        ),
        Some(libc::EISDIR) => format!(
            "that is a directory: name a file inside it, e.g. `-o {}`",
            path.join("profile.svg").display()
        ),
        Some(libc::ENOTDIR) => "a component of the path is a file, not a directory".to_string(),
        Some(libc::EACCES | libc::EPERM) => format!(
            "no permission to write there: write to a directory you own, or fix the permissions of {}",
            dir.display()
        ),
        Some(libc::EROFS) => "the filesystem is read-only: write elsewhere".to_string(),
        Some(libc::ENOSPC | libc::EDQUOT) => "the disk is full: free space or write elsewhere".to_string(),
        _ => "write elsewhere".to_string(),
    }
}

/// Where [`save`] put the bytes.
#[derive(Debug)]
pub(crate) enum Saved {
    /// Where they were asked to go.
    AtPath,
    /// Writing the path failed with `error`; the bytes are in `fallback` instead.
    Fallback {
        error: std::io::Error,
        fallback: PathBuf,
    },
}

/// Neither the path nor a fallback file could be written.
#[derive(Debug, thiserror::Error)]
#[error("writing {} failed ({error}), and so did saving {what} to {} ({fallback_error})", path.display(), fallback_dir.display())]
pub(crate) struct Lost {
    pub what: &'static str,
    pub path: PathBuf,
    pub error: std::io::Error,
    pub fallback_dir: PathBuf,
    pub fallback_error: std::io::Error,
}

/// Writes `bytes` to `path`; if that fails, to a new file in the temporary directory named
/// `pyebpf-<date>-<time>-<pid>[-n].<extension>`.
pub(crate) fn save(
    path: &Path,
    bytes: &[u8],
    extension: &str,
    what: &'static str,
) -> Result<Saved, Lost> {
    let error = match write_file(path, bytes) {
        Ok(()) => return Ok(Saved::AtPath),
        Err(e) => e,
    };
    let dir = std::env::temp_dir();
    match write_fallback(&dir, bytes, extension) {
        Ok(fallback) => Ok(Saved::Fallback { error, fallback }),
        Err(fallback_error) => Err(Lost {
            what,
            path: path.to_path_buf(),
            error,
            fallback_dir: dir,
            fallback_error,
        }),
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    // Sync a regular file so that a full disk or a failing NFS server is noticed here; a pipe
    // or terminal (`-o /dev/stdout`) cannot be synced and needs not be.
    let regular = file.metadata().is_ok_and(|m| m.is_file());
    let written = file
        .write_all(bytes)
        .and_then(|()| if regular { file.sync_all() } else { Ok(()) });
    if let Err(e) = written {
        // A half-written regular file would pass for the profile: remove it (the message names
        // the fallback that holds the whole one).
        if std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            let _ = std::fs::remove_file(path);
        }
        return Err(e);
    }
    Ok(())
}

fn write_fallback(dir: &Path, bytes: &[u8], extension: &str) -> std::io::Result<PathBuf> {
    let stem = format!("pyebpf-{}-{}", timestamp(), std::process::id());
    let mut last = None;
    for n in 0..100 {
        let name = match n {
            0 => format!("{stem}.{extension}"),
            n => format!("{stem}-{n}.{extension}"),
        };
        let path = dir.join(name);
        let file = OpenOptions::new().write(true).create_new(true).open(&path);
        let mut file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        if let Err(e) = file.write_all(bytes).and_then(|()| file.sync_all()) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        return Ok(path);
    }
    Err(last.unwrap_or_else(|| std::io::Error::from(ErrorKind::AlreadyExists)))
}

/// Local time as `20261123-140905`, for file names.
pub(crate) fn timestamp() -> String {
    // SAFETY: `time` with a null pointer only returns the time; `localtime_r` fills the
    // zeroed `tm` we own.
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&now, &mut tm) };
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("pyebpf-destination-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn probe_leaves_no_trace() {
        let dir = scratch("trace");
        let new = dir.join("new.svg");
        probe(&new, "the profile").unwrap();
        assert!(!new.exists(), "the probe left {new:?} behind");
        let old = dir.join("old.svg");
        std::fs::write(&old, b"keep me").unwrap();
        probe(&old, "the profile").unwrap();
        assert_eq!(std::fs::read(&old).unwrap(), b"keep me");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn probe_names_the_problem_and_the_fix() {
        let dir = scratch("bad");
        let err = probe(&dir.join("missing/x.svg"), "the profile").unwrap_err();
        assert_eq!(err.error.raw_os_error(), Some(libc::ENOENT));
        assert!(err.to_string().contains("mkdir -p"), "{err}");
        let err = probe(&dir, "the profile").unwrap_err();
        assert_eq!(err.error.raw_os_error(), Some(libc::EISDIR));
        assert!(err.to_string().contains("name a file inside it"), "{err}");
        let file = dir.join("file");
        std::fs::write(&file, b"").unwrap();
        let err = probe(&file.join("x.svg"), "the profile").unwrap_err();
        assert_eq!(err.error.raw_os_error(), Some(libc::ENOTDIR));
        probe(Path::new("/dev/null"), "the profile").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn save_falls_back_to_the_temp_dir() {
        let dir = scratch("save");
        let path = dir.join("out.txt");
        assert!(matches!(
            save(&path, b"a;b 1\n", "txt", "the profile"),
            Ok(Saved::AtPath)
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"a;b 1\n");
        let gone = dir.join("gone/out.txt");
        let Ok(Saved::Fallback { error, fallback }) = save(&gone, b"a;b 2\n", "txt", "x") else {
            panic!("no fallback");
        };
        assert_eq!(error.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(fallback.parent(), Some(std::env::temp_dir().as_path()));
        assert!(fallback.to_string_lossy().ends_with(".txt"));
        assert_eq!(std::fs::read(&fallback).unwrap(), b"a;b 2\n");
        std::fs::remove_file(&fallback).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
