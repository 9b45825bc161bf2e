//! `railguard-agent`: parse the command line, build, run.

mod cli;

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut telemetry = railguard_telemetry::init("railguard-agent", "info,h2=warn");
    let result = cli::Cli::parse().run().await;
    telemetry.shutdown(); // flush OTLP before exit
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("railguard-agent: {e:#}");
            std::process::ExitCode::from(2)
        }
    };
    if railguard_agent::probe::transport::nixl::loaded() {
        // NIXL's libraries crash in their destructors at exit(): end without running them.
        let n = (0..=u8::MAX).find(|n| std::process::ExitCode::from(*n) == code).unwrap_or(1);
        railguard_agent::probe::transport::nixl::exit(n);
    }
    code
}
