//! Reading a secret file (a token, the agent credentials, a private key): only a file no other
//! local user can read or change is taken, so a secret never sits readable on a host by
//! accident.
//!
//! The rule is PostgreSQL's for its server key: a file owned by the reading user may have no
//! group or other permission (0600 or less); a file owned by root may also be group-readable
//! (0640 or less), which is what Kubernetes makes of a Secret volume with an `fsGroup`
//! (`defaultMode: 0440`). Anything looser is refused with the mode and the fix in the message;
//! the secret's contents never appear in an error.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why a secret file was not read.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is mode {mode:04o}: a secret must not be readable or writable by other users (chmod 600 {path}{root})",
        root = if *owned_by_root { ", or 640 when owned by root" } else { "" }
    )]
    TooOpen { path: PathBuf, mode: u32, owned_by_root: bool },
    #[error("{path} is empty")]
    Empty { path: PathBuf },
}

/// Checks `path`'s permissions as [the module](self) says, following links (a Kubernetes
/// Secret's files are links into its `..data` directory).
pub fn check(path: &Path) -> Result<(), SecretError> {
    let meta = std::fs::metadata(path).map_err(|source| SecretError::Io { path: path.to_owned(), source })?;
    let mode = meta.mode() & 0o7777;
    let owned_by_root = meta.uid() == 0;
    let forbidden = if owned_by_root { 0o037 } else { 0o077 };
    if mode & forbidden != 0 {
        return Err(SecretError::TooOpen { path: path.to_owned(), mode, owned_by_root });
    }
    Ok(())
}

/// Reads a one-line secret (a token): checked, then trimmed; an empty file is refused.
pub fn read(path: &Path) -> Result<String, SecretError> {
    let text = read_text(path)?;
    let t = text.trim();
    if t.is_empty() {
        return Err(SecretError::Empty { path: path.to_owned() });
    }
    Ok(t.to_owned())
}

/// Reads a secret file whole (credentials, a key), checked.
pub fn read_text(path: &Path) -> Result<String, SecretError> {
    check(path)?;
    std::fs::read_to_string(path).map_err(|source| SecretError::Io { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(mode: u32) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), "  s3cret-token-0123456789\n").unwrap();
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        f
    }

    #[test]
    fn only_a_private_file_is_read_and_the_secret_is_never_in_the_error() {
        assert_eq!(read(file(0o600).path()).unwrap(), "s3cret-token-0123456789");
        assert_eq!(read(file(0o400).path()).unwrap(), "s3cret-token-0123456789");
        let root = own_uid() == 0;
        for mode in [0o644, 0o604, 0o606, 0o660, 0o620] {
            let e = read(file(mode).path()).unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, SecretError::TooOpen { .. }), "{mode:o}: {text}");
            assert!(text.contains(&format!("mode {mode:04o}")) && text.contains("chmod 600"), "{text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
        // Group-readable is taken only from a root-owned file (a Kubernetes Secret with fsGroup).
        assert_eq!(read(file(0o640).path()).is_ok(), root);
        let empty = tempfile::NamedTempFile::new().unwrap();
        std::fs::set_permissions(empty.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(read(empty.path()), Err(SecretError::Empty { .. })));
        assert!(matches!(read(Path::new("/nonexistent/token")), Err(SecretError::Io { .. })));
    }

    /// The uid that owns files this process creates.
    fn own_uid() -> u32 {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::metadata(f.path()).unwrap().uid()
    }
}
