//! `railguard-collector export`: probe, signal and status history as Parquet or CSV files.

use std::path::PathBuf;

use railguard_collector::export::{self, Format};

use super::{ReadDbArgs, TimeRangeArgs};

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    db: ReadDbArgs,
    #[command(flatten)]
    range: TimeRangeArgs,
    /// File format.
    #[arg(long, value_enum, default_value = "parquet")]
    format: Format,
    /// Directory for probes.*, signals.*, status_changes.*.
    #[arg(long)]
    out: PathBuf,
}

impl ExportArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let (since, until) = self.range.range()?;
        let pool = self.db.connect().await?;
        for (path, rows) in export::export(&pool, since, until, self.format, &self.out).await? {
            println!("{} ({rows} rows)", path.display());
        }
        Ok(())
    }
}
