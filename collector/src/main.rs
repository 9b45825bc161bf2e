//! `railguard-collector`: parse the command line, build, run.

mod cli;

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let mut telemetry = railguard_telemetry::init("railguard-collector", "info,sqlx=warn,h2=warn");
    let result = cli::Cli::parse().run().await;
    telemetry.shutdown(); // flush OTLP before exit
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("railguard-collector: {e:#}");
            ExitCode::from(2)
        }
    }
}
