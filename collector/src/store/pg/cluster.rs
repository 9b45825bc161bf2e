//! A private PostgreSQL cluster run from the machine's own binaries (`initdb`, `pg_ctl`).
//!
//! Used by the collector when `DATABASE_URL` is unset, by the demo, and by every test that
//! needs a database. It listens on a Unix socket inside its data directory only (no TCP), so
//! parallel clusters never collide and nothing is reachable from the network. Postgres refuses
//! to run as root; when we are root the cluster runs as its own system user, [`PG_USER`]
//! (`scripts/setup.sh` creates it; `RAILGUARD_PG_USER` names another), which nothing else runs
//! as: the data directory (0700) and its socket are that user's alone, so no other service's
//! process can rewrite `pg_hba.conf` or reach the socket. Run as another user, the cluster runs
//! as that user.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::sizing::ServerSizing;
use sqlx::postgres::PgConnectOptions;

/// The database user and database name inside a private cluster.
pub const SUPERUSER: &str = "railguard";
pub const DATABASE_NAME: &str = "railguard";
/// The system user the private cluster runs as when the collector runs as root.
pub const PG_USER: &str = "railguard-pg";
const PORT: u16 = 5432; // only names the socket file: .s.PGSQL.5432 inside the data dir

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "no PostgreSQL server binaries found (looked at $RAILGUARD_PG_BINDIR, `pg_config --bindir`, \
         /usr/lib/postgresql/*/bin and $PATH): install them (Debian/Ubuntu: `apt-get install postgresql`), \
         or set DATABASE_URL to an existing database"
    )]
    BinariesNotFound,
    #[error(
        "system user {user:?} to run the private postgres as (we are root) does not exist: create it \
         (scripts/setup.sh does: useradd --system --user-group --no-create-home --shell /usr/sbin/nologin {user}) \
         or set RAILGUARD_PG_USER to a user that no other service runs as"
    )]
    NoUser { user: String },
    #[error(
        "{path} is not reachable by user {user:?} (a parent directory lacks o+x); choose a data dir under /var/lib or /tmp"
    )]
    NotTraversable { path: PathBuf, user: String },
    #[error("{what} failed: {stderr}")]
    Command { what: String, stderr: String },
    #[error(
        "the private Postgres under {data_dir} is not running (it runs while the collector does): start the collector, \
         or ask for it to be started"
    )]
    NotRunning { data_dir: PathBuf },
    #[error("I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A running private cluster. Dropping it does not stop it; call [`PrivateCluster::stop`]
/// (the collector does on shutdown). A cluster left running by a killed process is reused by
/// the next [`PrivateCluster::start`] on the same directory.
#[derive(Debug)]
pub struct PrivateCluster {
    bin_dir: PathBuf,
    data_dir: PathBuf,
    run_as: Option<(u32, u32)>,
    user_name: String,
    /// The superuser's password (scram-sha-256), from `postgres.password` beside the data
    /// directory (mode 0600). None: a cluster initialised before passwords, which trusts local
    /// connections (said at start).
    password: Option<String>,
}

/// Where a cluster's password is kept: beside its data directory, readable by the collector's
/// user only (not by the server's unprivileged user, who never needs it).
fn password_file(data_dir: &Path) -> PathBuf {
    let name = data_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    data_dir.with_file_name(format!("{name}.password"))
}

/// 32 random bytes as hex.
fn new_password() -> Result<String, std::io::Error> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes `text` to `path`, readable and writable by its owner only.
fn write_private(path: &Path, text: &str) -> Result<(), ClusterError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| ClusterError::Io { path: path.to_path_buf(), source };
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)
}

impl PrivateCluster {
    /// Initialises `data_dir` if it is empty and starts the server. `durable = false` turns off
    /// fsync, for throwaway test databases only; the collector and the benchmarks run durable.
    pub fn start(data_dir: &Path, durable: bool) -> Result<Self, ClusterError> {
        let bin_dir = find_bindir()?;
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ClusterError::Io { path, source }
        };
        std::fs::create_dir_all(data_dir).map_err(io(data_dir))?;
        let data_dir = data_dir.canonicalize().map_err(io(data_dir))?;
        let (run_as, user_name) = unprivileged_user()?;
        if let Some((uid, gid)) = run_as {
            check_traversable(&data_dir, &user_name)?;
            nix::unistd::chown(&data_dir, Some(uid.into()), Some(gid.into()))
                .map_err(|e| ClusterError::Io { path: data_dir.clone(), source: e.into() })?;
        }
        std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(0o700)).map_err(io(&data_dir))?;
        let pw_path = password_file(&data_dir);
        let mut cluster = PrivateCluster { bin_dir, data_dir, run_as, user_name, password: None };
        if !cluster.data_dir.join("PG_VERSION").exists() {
            let password = new_password().map_err(io(&pw_path))?;
            write_private(&pw_path, &password)?;
            cluster.initdb(&password)?;
            cluster.password = Some(password);
        } else {
            match std::fs::read_to_string(&pw_path) {
                Ok(p) => cluster.password = Some(p.trim().to_owned()),
                Err(_) => tracing::warn!(
                    data_dir = %cluster.data_dir.display(),
                    "this private Postgres was created before passwords and trusts every local connection as its user; \
                     move it away to have a new one created with a password"
                ),
            }
        }
        cluster.write_config(durable)?;
        if !cluster.is_running() {
            // A crashed server leaves postmaster.pid behind; pg_ctl handles a stale one.
            cluster.pg_ctl(&["start", "-w", "-t", "60", "-l", "server.log"])?;
        }
        Ok(cluster)
    }

    /// The cluster under `data_dir` as it is: running, never created, started or reconfigured
    /// (a reader's connection to the collector's own database).
    pub fn attach(data_dir: &Path) -> Result<Self, ClusterError> {
        let bin_dir = find_bindir()?;
        let data_dir =
            data_dir.canonicalize().map_err(|source| ClusterError::Io { path: data_dir.to_path_buf(), source })?;
        let (run_as, user_name) = unprivileged_user()?;
        let password = std::fs::read_to_string(password_file(&data_dir)).ok().map(|p| p.trim().to_owned());
        let cluster = PrivateCluster { bin_dir, data_dir, run_as, user_name, password };
        if !cluster.is_running() {
            return Err(ClusterError::NotRunning { data_dir: cluster.data_dir });
        }
        Ok(cluster)
    }

    /// Initialises the cluster with password authentication for every connection: a local
    /// process running as the server's (unprivileged, widely shared) user gets nothing without it.
    fn initdb(&self, password: &str) -> Result<(), ClusterError> {
        // initdb (as the server's user) reads the password from a file it alone can read,
        // removed right after.
        let pwfile = self.data_dir.with_file_name(".initdb-password");
        write_private(&pwfile, password)?;
        if let Some((uid, gid)) = self.run_as {
            nix::unistd::chown(&pwfile, Some(uid.into()), Some(gid.into()))
                .map_err(|e| ClusterError::Io { path: pwfile.clone(), source: e.into() })?;
        }
        let out = self
            .command("initdb")
            .args(["--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-instructions"])
            .arg(format!("--username={SUPERUSER}"))
            .arg(format!("--pwfile={}", pwfile.display()))
            .arg("-D")
            .arg(&self.data_dir)
            .output();
        let _ = std::fs::remove_file(&pwfile);
        check("initdb", out)?;
        Ok(())
    }

    fn write_config(&self, durable: bool) -> Result<(), ClusterError> {
        // postgresql.auto.conf is read last; we own it entirely.
        let conf = format!(
            "# written by railguard-collector\nlisten_addresses = ''\nunix_socket_directories = '{dir}'\n\
             unix_socket_permissions = 0700\nport = {PORT}\nfsync = {fsync}\nsynchronous_commit = {fsync}\n\
             full_page_writes = {fsync}\nmax_connections = 200\nlogging_collector = off\n{sizing}",
            dir = self.data_dir.display(),
            fsync = if durable { "on" } else { "off" },
            sizing = if durable { ServerSizing::for_this_machine() } else { ServerSizing::SMALL }.conf(),
        );
        let path = self.data_dir.join("postgresql.auto.conf");
        std::fs::write(&path, conf).map_err(|source| ClusterError::Io { path: path.clone(), source })?;
        if let Some((uid, gid)) = self.run_as {
            nix::unistd::chown(&path, Some(uid.into()), Some(gid.into()))
                .map_err(|e| ClusterError::Io { path, source: e.into() })?;
        }
        Ok(())
    }

    fn is_running(&self) -> bool {
        self.command("pg_ctl")
            .arg("status")
            .arg("-D")
            .arg(&self.data_dir)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<Output, ClusterError> {
        let out = self.command("pg_ctl").arg("-D").arg(&self.data_dir).args(args).output();
        check(&format!("pg_ctl {}", args.first().copied().unwrap_or("")), out)
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(program));
        cmd.current_dir(&self.data_dir);
        // Keep the collector's own settings away from the server (PGDATA, PGPORT, ...).
        for (k, _) in std::env::vars_os() {
            if k.to_str().is_some_and(|k| k.starts_with("PG")) {
                cmd.env_remove(k);
            }
        }
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid).env("HOME", &self.data_dir).env("USER", &self.user_name);
        }
        cmd
    }

    /// Stops the server (fast shutdown: open transactions roll back).
    pub fn stop(&self) -> Result<(), ClusterError> {
        if self.is_running() {
            self.pg_ctl(&["stop", "-w", "-m", "fast"])?;
        }
        Ok(())
    }

    /// Restarts the server; clients see their connections drop, as in a real Postgres restart.
    pub fn restart(&self) -> Result<(), ClusterError> {
        self.pg_ctl(&["restart", "-w", "-m", "fast", "-l", "server.log"])?;
        Ok(())
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Connection options for `database` over the cluster's Unix socket.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        let opts = PgConnectOptions::new()
            .host(&self.data_dir.to_string_lossy())
            .port(PORT)
            .username(SUPERUSER)
            .database(database);
        match &self.password {
            Some(p) => opts.password(p),
            None => opts,
        }
    }

    /// A `postgresql://` URL (socket directory in the query), understood by psql and sqlx. It
    /// holds the password: give it only to what may write the database.
    pub fn url(&self, database: &str) -> String {
        let password = self.password.as_ref().map(|p| format!("&password={p}")).unwrap_or_default();
        format!("postgresql:///{database}?host={}&port={PORT}&user={SUPERUSER}{password}", self.data_dir.display())
    }

    /// [`url`](Self::url) without the password, for logs: where the cluster is and who connects.
    pub fn display_url(&self, database: &str) -> String {
        format!("postgresql:///{database}?host={}&port={PORT}&user={SUPERUSER}", self.data_dir.display())
    }

    /// Where the password is kept (mode 0600).
    pub fn password_file(&self) -> PathBuf {
        password_file(&self.data_dir)
    }

    /// Creates `name` (if missing) from the `postgres` maintenance database.
    pub async fn create_database(&self, name: &str) -> Result<(), sqlx::Error> {
        use sqlx::{Connection, Executor};
        let mut conn = sqlx::PgConnection::connect_with(&self.connect_options("postgres")).await?;
        let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
            .bind(name)
            .fetch_optional(&mut conn)
            .await?;
        if exists.is_none() {
            // CREATE DATABASE takes no bind parameters; quote_ident() makes the name safe.
            let quoted: String = sqlx::query_scalar("SELECT quote_ident($1)").bind(name).fetch_one(&mut conn).await?;
            conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {quoted}"))).await?;
        }
        conn.close().await
    }
}

fn check(what: &str, out: std::io::Result<Output>) -> Result<Output, ClusterError> {
    match out {
        Ok(o) if o.status.success() => Ok(o),
        Ok(o) => Err(ClusterError::Command {
            what: what.to_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).trim().chars().take(2000).collect(),
        }),
        Err(e) => Err(ClusterError::Command { what: what.to_owned(), stderr: e.to_string() }),
    }
}

/// Finds the directory holding `initdb` and `pg_ctl` ($RAILGUARD_PG_BINDIR first).
pub fn find_bindir() -> Result<PathBuf, ClusterError> {
    find_bindir_with(std::env::var_os("RAILGUARD_PG_BINDIR").map(PathBuf::from))
}

fn has_tools(d: &Path) -> bool {
    d.join("initdb").is_file() && d.join("pg_ctl").is_file()
}

fn find_bindir_with(explicit: Option<PathBuf>) -> Result<PathBuf, ClusterError> {
    if let Some(d) = explicit {
        return if has_tools(&d) { Ok(d) } else { Err(ClusterError::BinariesNotFound) };
    }
    if let Ok(o) = Command::new("pg_config").arg("--bindir").output() {
        let d = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
        if o.status.success() && has_tools(&d) {
            return Ok(d);
        }
    }
    // Debian keeps server binaries out of $PATH, one directory per major version: take the newest.
    if let Ok(rd) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = rd
            .filter_map(Result::ok)
            .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
            .filter(|(_, d)| has_tools(d))
            .collect();
        versions.sort();
        if let Some((_, d)) = versions.pop() {
            return Ok(d);
        }
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .find(|d| has_tools(d))
        .and_then(|d| std::fs::canonicalize(d.join("initdb")).ok()?.parent().map(Path::to_path_buf))
        .filter(|d| has_tools(d))
        .ok_or(ClusterError::BinariesNotFound)
}

fn unprivileged_user() -> Result<(Option<(u32, u32)>, String), ClusterError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok((None, std::env::var("USER").unwrap_or_default()));
    }
    let name = std::env::var("RAILGUARD_PG_USER").unwrap_or_else(|_| PG_USER.to_owned());
    match nix::unistd::User::from_name(&name) {
        Ok(Some(u)) => Ok((Some((u.uid.as_raw(), u.gid.as_raw())), name)),
        _ => Err(ClusterError::NoUser { user: name }),
    }
}

fn check_traversable(dir: &Path, user: &str) -> Result<(), ClusterError> {
    for anc in dir.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(anc) else {
            continue;
        };
        if meta.permissions().mode() & 0o001 == 0 {
            return Err(ClusterError::NotTraversable { path: anc.to_path_buf(), user: user.to_owned() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn missing_binaries_name_the_package_to_install() {
        let empty = tempfile::tempdir().unwrap();
        let e = find_bindir_with(Some(empty.path().to_path_buf())).unwrap_err().to_string();
        assert!(e.contains("apt-get install postgresql"), "{e}");
        // This machine has them (CI installs them through scripts/setup.sh).
        assert!(has_tools(&find_bindir_with(None).unwrap()));
    }

    #[test]
    fn url_points_at_the_socket_directory() {
        let c = PrivateCluster {
            bin_dir: "/x".into(),
            data_dir: "/tmp/rg data/pg".into(),
            run_as: None,
            user_name: String::new(),
            password: Some("0123abcd".into()),
        };
        let opts: PgConnectOptions = c.url("railguard").parse().unwrap();
        assert_eq!(opts.get_socket().map(|p| p.as_path()), Some(Path::new("/tmp/rg data/pg")));
        assert!(c.url("railguard").ends_with("&password=0123abcd"));
        assert_eq!(c.password_file(), Path::new("/tmp/rg data/pg.password"));
        assert_eq!(opts.get_username(), SUPERUSER);
        assert_eq!(opts.get_database(), Some("railguard"));
    }
}
