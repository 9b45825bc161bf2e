//! The collector's command line: one file per subcommand; the shared flags (database, time
//! range) and the table printer are here.

#[cfg(not(feature = "analysis"))]
mod analysis_absent;
mod api_client;
#[cfg(feature = "analysis")]
mod export;
mod output;
mod query;
#[cfg(feature = "analysis")]
mod report;
mod serve;
mod table;
pub mod terminal;

use std::path::PathBuf;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use railguard_collector::DatabaseConfig;
use railguard_collector::http::params;
use railguard_collector::store::pg::{self, PrivateCluster};

/// railguard's central service: ingests agent records into Postgres, assesses every GPU, and
/// serves the read-only API and metrics.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the collector: gRPC ingest for agents, assessment, HTTP API and /metrics.
    Serve(serve::ServeArgs),
    /// Ask the history from a terminal (table or JSON).
    Query(query::QueryArgs),
    /// Write probe, signal and status history to Parquet or CSV files.
    #[cfg(feature = "analysis")]
    Export(export::ExportArgs),
    /// Fleet report: failure rates per GPU and per pair, and patterns across nodes.
    #[cfg(feature = "analysis")]
    Report(report::ReportArgs),
    /// Write probe, signal and status history to Parquet or CSV files (not in this build).
    #[cfg(not(feature = "analysis"))]
    Export(analysis_absent::Absent),
    /// Fleet report (not in this build).
    #[cfg(not(feature = "analysis"))]
    Report(analysis_absent::Absent),
}

impl Cli {
    pub async fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Serve(a) => a.run().await,
            Command::Query(a) => a.run().await,
            #[cfg(feature = "analysis")]
            Command::Export(a) => a.run().await,
            #[cfg(feature = "analysis")]
            Command::Report(a) => a.run().await,
            #[cfg(not(feature = "analysis"))]
            Command::Export(a) => a.run("export"),
            #[cfg(not(feature = "analysis"))]
            Command::Report(a) => a.run("report"),
        }
    }
}

/// Which Postgres.
#[derive(Debug, Clone, clap::Args)]
pub struct DbArgs {
    /// Postgres to use. Unset: a private cluster under --data-dir, started and stopped with
    /// the collector (needs the PostgreSQL server binaries installed).
    #[arg(long, env = "DATABASE_URL", global = true)]
    database_url: Option<String>,
    /// File holding the database password (owner-only), for --database-url and
    /// --database-read-url given without one: a URL given as an argument is readable by every
    /// local user in /proc/PID/cmdline. Unset: the URL's own, or libpq's PGPASSFILE (~/.pgpass).
    #[arg(long, env = "DATABASE_PASSWORD_FILE", global = true)]
    database_password_file: Option<PathBuf>,
    /// Directory for the private Postgres cluster (when --database-url is unset).
    #[arg(long, env = "RAILGUARD_DATA_DIR", default_value = ".railguard/collector", global = true)]
    data_dir: PathBuf,
}

/// The database a reading command (`query`, `report`, `export`) opens directly.
#[derive(Debug, clap::Args)]
pub struct ReadDbArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Reading a private cluster the collector is not running: start it (it is left running).
    /// Without it, a stopped cluster is an error; a missing one always is.
    #[arg(long, global = true)]
    start_database: bool,
}

impl DbArgs {
    /// The password from --database-password-file, when given.
    pub fn password(&self) -> anyhow::Result<Option<railguard_collector::store::pg::DbPassword>> {
        self.database_password_file
            .as_deref()
            .map(railguard_collector::store::pg::DbPassword::from_file)
            .transpose()
            .context("--database-password-file")
    }

    pub fn config(&self) -> DatabaseConfig {
        match &self.database_url {
            Some(url) => DatabaseConfig::Url(url.clone()),
            None => DatabaseConfig::Private { data_dir: self.data_dir.clone() },
        }
    }
}

impl ReadDbArgs {
    /// A pool on the database, migrated. A private cluster is used while the collector runs it,
    /// started only with --start-database; one that does not exist is an error.
    pub async fn connect(&self) -> anyhow::Result<sqlx::PgPool> {
        let opts = match self.db.config() {
            DatabaseConfig::Url(url) => {
                let opts: sqlx::postgres::PgConnectOptions =
                    url.parse().context("DATABASE_URL is not a valid Postgres URL")?;
                match self.db.password()? {
                    Some(p) => p.apply(opts),
                    None => opts,
                }
            }
            DatabaseConfig::Private { data_dir } => {
                let dir = data_dir.join("postgres");
                // Never a new cluster: an empty one would answer every question with nothing.
                if !dir.join("PG_VERSION").is_file() {
                    anyhow::bail!(
                        "no collector database under {} (give the collector's --data-dir, or --database-url)",
                        dir.display()
                    );
                }
                let start = self.start_database;
                let cluster = tokio::task::spawn_blocking(move || {
                    if start { PrivateCluster::start(&dir, true) } else { PrivateCluster::attach(&dir) }
                })
                .await??;
                cluster.connect_options(pg::DATABASE_NAME)
            }
        };
        let opts: sqlx::postgres::PgConnectOptions = opts;
        let at = format!("{}:{}", opts.get_host(), opts.get_port());
        pg::connect_and_migrate(opts, 2).await.with_context(|| format!("connecting to Postgres at {at}"))
    }
}

/// A period of history.
#[derive(Debug, Clone, clap::Args)]
pub struct TimeRangeArgs {
    /// Start: an RFC 3339 time or a duration before now (30d, 2h, 15m, 90s).
    #[arg(long, default_value = "30d")]
    pub since: String,
    /// End: an RFC 3339 time or a duration before now. Default: now.
    #[arg(long)]
    pub until: Option<String>,
}

impl TimeRangeArgs {
    pub fn range(&self) -> anyhow::Result<(DateTime<Utc>, DateTime<Utc>)> {
        Ok(params::time_range(Some(&self.since), self.until.as_deref(), "30d")?)
    }
}
