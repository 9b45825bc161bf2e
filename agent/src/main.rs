//! `railguard-agent`: parse the command line, build, run.

mod cli;

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut telemetry = railguard_telemetry::init("railguard-agent", "info,h2=warn");
    let result = cli::Cli::parse().run().await;
    telemetry.shutdown(); // flush OTLP before exit
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("railguard-agent: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
