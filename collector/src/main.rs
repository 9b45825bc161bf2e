//! `railguard-collector`: parse the command line, build, run.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use railguard_collector::{DatabaseConfig, ServeConfig, serve::serve};

/// railguard's central service: ingests agent records into Postgres.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the collector: gRPC ingest for agents.
    Serve(ServeArgs),
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address for agents' gRPC connections.
    #[arg(long, env = "RAILGUARD_GRPC_LISTEN", default_value = "127.0.0.1:7700")]
    grpc_listen: SocketAddr,
    /// Postgres to use. Unset: a private cluster under --data-dir, started and stopped with
    /// the collector (needs the PostgreSQL server binaries installed).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Directory for the private Postgres cluster (when --database-url is unset).
    #[arg(
        long,
        env = "RAILGUARD_DATA_DIR",
        default_value = ".railguard/collector"
    )]
    data_dir: PathBuf,
    /// Agent credentials: one `NODE_ID TOKEN` (or `NODE_ID sha256:HEX`) per line.
    #[arg(long, env = "RAILGUARD_CREDENTIALS")]
    credentials: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn,h2=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Serve(a) => {
            let cfg = ServeConfig {
                grpc_listen: a.grpc_listen,
                database: match a.database_url {
                    Some(url) => DatabaseConfig::Url(url),
                    None => DatabaseConfig::Private {
                        data_dir: a.data_dir,
                    },
                },
                credentials: a.credentials,
            };
            serve(cfg, shutdown_signal()).await
        }
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the collector");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
