//! `railguard-agent snapshot`: capture what `topo` reads, for bug reports.

use std::path::PathBuf;
use std::process::ExitCode;

use railguard_agent::topology::snapshot;

#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    /// Output file (tar.gz); unpack it and run `topo --sysfs-root DIR` on the result.
    #[arg(long)]
    out: PathBuf,
    /// Read this directory as /sys.
    #[arg(long, default_value = "/sys")]
    sysfs_root: PathBuf,
    /// Read this directory as /proc.
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
}

impl SnapshotArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let n = snapshot::capture(&self.sysfs_root, &self.proc_root, &self.out)?;
        eprintln!("wrote {} ({n} entries)", self.out.display());
        Ok(ExitCode::SUCCESS)
    }
}
