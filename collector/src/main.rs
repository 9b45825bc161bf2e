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
            // An error may quote a server's or a database's text: shown, never acted on.
            eprintln!("railguard-collector: {}", cli::terminal::safe(&format!("{e:#}")));
            ExitCode::from(2)
        }
    }
}
