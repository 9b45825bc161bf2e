//! The database password, kept out of URLs given as arguments: a process's argv is readable by
//! every local user (`/proc/PID/cmdline`), its environment and its files are not. Read from an
//! owner-only file (`--database-password-file`), never logged; libpq's `PGPASSFILE`
//! (`~/.pgpass`) is read by the driver where neither the URL nor the file gives one.

use std::path::Path;

use sqlx::postgres::PgConnectOptions;

/// A password for the collector's database connections. Its `Debug` says nothing of it.
#[derive(Clone)]
pub struct DbPassword(String);

impl std::fmt::Debug for DbPassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DbPassword(..)")
    }
}

impl DbPassword {
    /// The password in `path`: an owner-only file, its first line trimmed (the error names the
    /// file and what is wrong, never the secret).
    pub fn from_file(path: &Path) -> Result<DbPassword, railguard_telemetry::secret::SecretError> {
        railguard_telemetry::secret::read(path).map(DbPassword)
    }

    /// `opts` with this password.
    pub fn apply(&self, opts: PgConnectOptions) -> PgConnectOptions {
        opts.password(&self.0)
    }
}

/// Whether any of `args` holds a Postgres URL with a password in it (`postgres://u:pw@h/db`,
/// also as `--flag=URL`).
pub fn password_in_args<I: IntoIterator<Item = S>, S: AsRef<str>>(args: I) -> bool {
    args.into_iter().any(|a| {
        let a = a.as_ref();
        ["postgres://", "postgresql://"].iter().any(|scheme| {
            a.find(scheme).is_some_and(|at| {
                let rest = &a[at + scheme.len()..];
                let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
                authority.rsplit_once('@').is_some_and(|(userinfo, _)| userinfo.contains(':'))
            })
        })
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_password_in_a_url_argument_is_found_and_only_then() {
        assert!(password_in_args(["serve", "--database-url", "postgresql://rg:s3cret@127.0.0.1:5432/railguard"]));
        assert!(password_in_args(["--database-url=postgres://rg:s3cret@db/railguard?sslmode=require"]));
        assert!(!password_in_args(["--database-url", "postgresql://rg@127.0.0.1:5432/railguard"]));
        assert!(!password_in_args(["--database-url", "postgresql://127.0.0.1/railguard?user=rg"]));
        assert!(!password_in_args(["--dashboard-url", "https://a:b@example/"]));
    }

    #[test]
    fn the_password_is_never_in_its_debug_form() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pw");
        std::fs::write(&f, "s3cret-pw\n").unwrap();
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let e = DbPassword::from_file(&f).unwrap_err().to_string();
        assert!(!e.contains("s3cret"), "{e}");
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let p = DbPassword::from_file(&f).unwrap();
        assert_eq!(format!("{p:?}"), "DbPassword(..)");
    }
}
