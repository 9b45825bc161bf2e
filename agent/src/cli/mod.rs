//! The agent's command line: one file per subcommand.

mod fixture;
mod preflight;
mod probe;
mod probing;
mod run;
mod selftest;
mod snapshot;
pub mod topo;
pub mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// railguard's node agent.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent: spool records and ship them to the collector.
    Run(run::RunArgs),
    /// Print the GPU×NIC topology (like `nvidia-smi topo -m`) with per-GPU risk. Exits 3 when it finds
    /// no GPU (saying so on stderr), and fails on a --sysfs-root that is not a sysfs tree.
    Topo(topo::TopoArgs),
    /// Capture the /sys and /proc files `topo` reads into a tar.gz (for bug reports).
    Snapshot(snapshot::SnapshotArgs),
    /// Write a simulated node's /sys and /proc tree (for demos and tests without GPUs).
    SimFixture(fixture::FixtureArgs),
    /// Verified transfers over GPU/NIC pairs: the receiver checks every byte.
    Probe(probe::ProbeArgs),
    /// Verify each GPU's predicted or pinned path; non-zero exit with one line per failing GPU.
    Preflight(preflight::PreflightArgs),
    /// Prove the receiver's check (every fault kind, applied by the engine) and each transport's
    /// own failure behaviour (failures it suffers for real), reported separately.
    Selftest(selftest::SelftestArgs),
    /// Stream attributed events as they happen: eBPF (UCX error CQEs, IOMMU/AER/devlink
    /// tracepoints), the kernel log, NIC error counters and NVML Xid events.
    Watch(watch::WatchArgs),
}

impl Cli {
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        if !matches!(self.command, Command::Run(_)) {
            quiet_on_closed_stdout();
        }
        match self.command {
            Command::Run(a) => a.run().await,
            Command::Topo(a) => a.run(),
            Command::Snapshot(a) => a.run(),
            Command::SimFixture(a) => a.run(),
            Command::Probe(a) => a.run(),
            Command::Preflight(a) => a.run(),
            Command::Selftest(a) => a.run(),
            Command::Watch(a) => a.run(),
        }
    }
}

/// A command whose output is piped into `head` ends quietly when the reader goes, as Unix tools
/// do, instead of Rust's panic on a failed print. (Socket writes are unaffected: std sends with
/// MSG_NOSIGNAL.) Not for `run`, the long-lived service.
#[allow(unsafe_code)]
fn quiet_on_closed_stdout() {
    // SAFETY: sets the process's SIGPIPE disposition to the default before any thread that
    // could rely on it being ignored exists; no handler code runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
