//! `railguard-agent`: parse the command line, build, run.

mod cli;

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,h2=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli::Cli::parse().run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("railguard-agent: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
