//! `railguard-collector`: parse the command line, build, run.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use railguard_collector::http::params;
use railguard_collector::pg::{self, PrivateCluster};
use railguard_collector::{DatabaseConfig, ServeConfig, serve::serve};

/// railguard's central service: ingests agent records into Postgres, assesses every GPU, and
/// serves the read-only API and metrics.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the collector: gRPC ingest for agents, assessment, HTTP API and /metrics.
    Serve(ServeArgs),
    /// Ask the history from a terminal (table or JSON).
    Query(QueryArgs),
    /// Write probe, signal and status history to Parquet or CSV files.
    #[cfg(feature = "analysis")]
    Export(ExportArgs),
    /// Fleet report: failure rates per GPU and per pair, and patterns across nodes.
    #[cfg(feature = "analysis")]
    Report(ReportArgs),
}

#[cfg(feature = "analysis")]
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum FormatArg {
    Parquet,
    Csv,
}

#[cfg(feature = "analysis")]
#[derive(Debug, clap::Args)]
struct ExportArgs {
    #[command(flatten)]
    db: DbArgs,
    /// RFC 3339 time or a duration before now (30d, 2h).
    #[arg(long, default_value = "30d")]
    since: String,
    #[arg(long)]
    until: Option<String>,
    #[arg(long, value_enum, default_value = "parquet")]
    format: FormatArg,
    /// Directory for probes.*, signals.*, status_changes.*.
    #[arg(long)]
    out: PathBuf,
}

#[cfg(feature = "analysis")]
#[derive(Debug, clap::Args)]
struct ReportArgs {
    #[command(flatten)]
    db: DbArgs,
    #[arg(long, default_value = "30d")]
    since: String,
    #[arg(long)]
    until: Option<String>,
    /// JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct DbArgs {
    /// Postgres to use. Unset: a private cluster under --data-dir, started and stopped with
    /// the collector (needs the PostgreSQL server binaries installed).
    #[arg(long, env = "DATABASE_URL", global = true)]
    database_url: Option<String>,
    /// Directory for the private Postgres cluster (when --database-url is unset).
    #[arg(long, env = "RAILGUARD_DATA_DIR", default_value = ".railguard/collector", global = true)]
    data_dir: PathBuf,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address for agents' gRPC connections.
    #[arg(long, env = "RAILGUARD_GRPC_LISTEN", default_value = "127.0.0.1:7700")]
    grpc_listen: SocketAddr,
    /// Address for the JSON API, the OpenAPI document and /metrics.
    #[arg(long, env = "RAILGUARD_HTTP_LISTEN", default_value = "127.0.0.1:7701")]
    http_listen: SocketAddr,
    /// Require this bearer token on /api/v1 (read from the file); unset: open read-only API.
    #[arg(long, env = "RAILGUARD_API_TOKEN_FILE")]
    api_token_file: Option<PathBuf>,
    #[command(flatten)]
    db: DbArgs,
    /// Agent credentials: one `NODE_ID TOKEN` (or `NODE_ID sha256:HEX`) per line.
    #[arg(long, env = "RAILGUARD_CREDENTIALS")]
    credentials: PathBuf,
    /// Also accept agents' projected Kubernetes service-account tokens, verified with the
    /// cluster's key set (`kubectl get --raw /openid/v1/jwks > jwks.json`); the node is the one
    /// the token names. No per-node secret to distribute.
    #[arg(long, env = "RAILGUARD_K8S_JWKS", requires = "k8s_issuer")]
    k8s_jwks: Option<PathBuf>,
    /// The cluster's service-account issuer (`iss` of its tokens).
    #[arg(long, env = "RAILGUARD_K8S_ISSUER")]
    k8s_issuer: Option<String>,
    /// The audience the agent DaemonSet requests for its projected token.
    #[arg(long, env = "RAILGUARD_K8S_AUDIENCE", default_value = "railguard")]
    k8s_audience: String,
    /// The agents' service account, `namespace:name`.
    #[arg(long, env = "RAILGUARD_K8S_SERVICE_ACCOUNT", default_value = "railguard:agent")]
    k8s_service_account: String,
    /// Sliding window of evidence for the assessment, in minutes.
    #[arg(long, default_value_t = 15)]
    window_minutes: u64,
    /// Seconds between assessments of the fleet.
    #[arg(long, default_value_t = 10)]
    assess_every_secs: u64,
    /// Days of probe and signal history kept (whole day partitions are dropped).
    #[arg(long, env = "RAILGUARD_RETENTION_DAYS", default_value_t = 30)]
    retention_days: u32,
}

#[derive(Debug, clap::Args)]
struct QueryArgs {
    #[command(subcommand)]
    what: QueryWhat,
    #[command(flatten)]
    db: DbArgs,
    /// JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum QueryWhat {
    /// Which GPUs failed verification, on which NIC, how often.
    Failures {
        /// RFC 3339 time or a duration before now (30d, 2h).
        #[arg(long, default_value = "30d")]
        since: String,
        #[arg(long)]
        until: Option<String>,
    },
    /// GPUs and their current status.
    Gpus {
        /// Comma-separated statuses: ok, watch, at_risk, corrupting.
        #[arg(long)]
        status: Option<String>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut telemetry = railguard_telemetry::init("railguard-collector", "info,sqlx=warn,h2=warn");
    let result = match Cli::parse().command {
        Command::Serve(a) => run_serve(a).await,
        Command::Query(q) => run_query(q).await,
        #[cfg(feature = "analysis")]
        Command::Export(e) => run_export(e).await,
        #[cfg(feature = "analysis")]
        Command::Report(r) => run_report(r).await,
    };
    telemetry.shutdown(); // flush OTLP before exit
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("railguard-collector: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn database(db: DbArgs) -> DatabaseConfig {
    match db.database_url {
        Some(url) => DatabaseConfig::Url(url),
        None => DatabaseConfig::Private { data_dir: db.data_dir },
    }
}

async fn run_serve(a: ServeArgs) -> anyhow::Result<()> {
    let mut cfg = ServeConfig::new(a.grpc_listen, database(a.db), a.credentials);
    cfg.http_listen = Some(a.http_listen);
    cfg.k8s = a.k8s_jwks.map(|jwks| railguard_collector::ingest::k8s::K8sTokenConfig {
        jwks,
        issuer: a.k8s_issuer.clone().unwrap_or_default(),
        audience: a.k8s_audience.clone(),
        service_account: a.k8s_service_account.clone(),
    });
    cfg.api_token = match a.api_token_file {
        Some(p) => {
            Some(std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?.trim().to_owned())
        }
        None => None,
    };
    cfg.assess.window = std::time::Duration::from_secs(a.window_minutes.max(1) * 60);
    cfg.assess.rules.window_label = format!("{} min", a.window_minutes.max(1));
    cfg.assess_every = std::time::Duration::from_secs(a.assess_every_secs.max(1));
    cfg.retention_days = a.retention_days.max(1);
    serve(cfg, railguard_telemetry::shutdown_signal()).await
}

async fn pool(db: DbArgs) -> anyhow::Result<sqlx::PgPool> {
    let opts = match database(db) {
        DatabaseConfig::Url(url) => url.parse().context("DATABASE_URL is not a valid Postgres URL")?,
        DatabaseConfig::Private { data_dir } => {
            // Reuses the collector's running cluster (or starts it: the data stays where it is).
            let dir = data_dir.join("postgres");
            let cluster = tokio::task::spawn_blocking(move || PrivateCluster::start(&dir, true)).await??;
            cluster.connect_options(pg::DATABASE_NAME)
        }
    };
    Ok(pg::connect_and_migrate(opts, 2).await?)
}

#[cfg(feature = "analysis")]
fn range(
    since: &str,
    until: Option<&str>,
) -> anyhow::Result<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)> {
    params::time_range(Some(since), until, "30d").map_err(|e| anyhow::anyhow!("{e}"))
}

#[cfg(feature = "analysis")]
async fn run_export(e: ExportArgs) -> anyhow::Result<()> {
    let (since, until) = range(&e.since, e.until.as_deref())?;
    let pool = pool(e.db).await?;
    let format = match e.format {
        FormatArg::Parquet => railguard_collector::export::Format::Parquet,
        FormatArg::Csv => railguard_collector::export::Format::Csv,
    };
    for (path, rows) in railguard_collector::export::export(&pool, since, until, format, &e.out).await? {
        println!("{} ({rows} rows)", path.display());
    }
    Ok(())
}

#[cfg(feature = "analysis")]
async fn run_report(r: ReportArgs) -> anyhow::Result<()> {
    let (since, until) = range(&r.since, r.until.as_deref())?;
    let pool = pool(r.db).await?;
    let probes = railguard_collector::export::probes(&pool, since, until).await?;
    let report = railguard_collector::export::report(&probes)?;
    if r.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("fleet report {since} .. {until}: {} probes on {} nodes", report["probes"], report["nodes"]);
    println!("\npatterns:");
    for p in report["patterns"].as_array().into_iter().flatten() {
        println!("  - {}", p["meaning"].as_str().unwrap_or(""));
    }
    println!("\nfailing GPUs:");
    print_table(&report["per_gpu"]);
    println!("\nfailing GPU/NIC pairs:");
    print_table(&report["per_pair"]);
    Ok(())
}

async fn run_query(q: QueryArgs) -> anyhow::Result<()> {
    let pool = pool(q.db).await?;
    let rows = match q.what {
        QueryWhat::Failures { since, until } => {
            let (since, until) =
                params::time_range(Some(&since), until.as_deref(), "30d").map_err(|e| anyhow::anyhow!("{e}"))?;
            railguard_collector::query::failures(&pool, since, until).await?
        }
        QueryWhat::Gpus { status } => {
            let statuses = status.as_deref().map(params::statuses).transpose().map_err(|e| anyhow::anyhow!("{e}"))?;
            railguard_collector::query::gpus(&pool, statuses).await?
        }
    };
    if q.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print_table(&rows);
    }
    Ok(())
}

/// Prints an array of flat JSON objects as an aligned table.
fn print_table(rows: &serde_json::Value) {
    let Some(rows) = rows.as_array().filter(|r| !r.is_empty()) else {
        println!("(none)");
        return;
    };
    // Identity columns first, in reading order; the rest as they come.
    let lead = ["node", "node_id", "gpu", "gpu_index", "nic", "status", "failures", "probes"];
    let mut cols: Vec<String> = lead.iter().filter(|c| rows[0].get(**c).is_some()).map(|c| (*c).to_owned()).collect();
    cols.extend(
        rows[0]
            .as_object()
            .map(|o| o.keys().filter(|k| !lead.contains(&k.as_str())).cloned().collect::<Vec<_>>())
            .unwrap_or_default(),
    );
    let cell = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        other => other.to_string(),
    };
    let widths: Vec<usize> = cols
        .iter()
        .map(|c| rows.iter().map(|r| cell(&r[c]).chars().count()).max().unwrap_or(0).max(c.len()).min(80))
        .collect();
    let line = |vals: Vec<String>| {
        vals.iter()
            .zip(&widths)
            .map(|(v, w)| format!("{:<w$}", v.chars().take(80).collect::<String>(), w = *w))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("{}", line(cols.clone()));
    for r in rows {
        println!("{}", line(cols.iter().map(|c| cell(&r[c])).collect()));
    }
}
