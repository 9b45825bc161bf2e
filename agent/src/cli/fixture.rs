//! `railguard-agent sim-fixture`: writes a simulated node's /sys and /proc tree (the machines
//! this project's demo and tests stand in for: no GPU or RDMA NIC is needed to read them).

use std::path::PathBuf;
use std::process::ExitCode;

use railguard_agent::topology::fixture;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Kind {
    /// The seed incident: KVM guest, 8×H200 + 8×ConnectX-7, GPU i and mlx5_i under one switch, no vIOMMU.
    SeedKvm,
    /// DGX-H100-like bare metal with the IOMMU in passthrough.
    DgxH100,
    /// A flat cloud VM with two GPUs and no RDMA NIC.
    FlatVm,
    /// Two-socket bare metal with a translating IOMMU and ACS redirect.
    TwoSocket,
}

#[derive(Debug, clap::Args)]
pub struct FixtureArgs {
    /// Which machine.
    kind: Kind,
    /// Output directory (gets sys/ and proc/); read it with `topo --sysfs-root DIR/sys`.
    #[arg(long)]
    out: PathBuf,
}

impl FixtureArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let spec = match self.kind {
            Kind::SeedKvm => fixture::seed_kvm_guest(),
            Kind::DgxH100 => fixture::dgx_h100_like(),
            Kind::FlatVm => fixture::flat_cloud_vm(),
            Kind::TwoSocket => fixture::two_socket_translating(),
        };
        if self.out.exists() {
            std::fs::remove_dir_all(&self.out)?;
        }
        spec.write(&self.out)?;
        eprintln!(
            "wrote simulated node tree to {} (read with --sysfs-root {}/sys)",
            self.out.display(),
            self.out.display()
        );
        Ok(ExitCode::SUCCESS)
    }
}
