//! `export` and `report` in a collector built without its `analysis` feature (polars: ~4 minutes
//! of build, left out of the demo's build): the commands exist and say how to get them, rather
//! than clap answering "unrecognized subcommand".

/// Whatever was given to the command: it does not run in this build.
#[derive(Debug, clap::Args)]
pub struct Absent {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    args: Vec<String>,
}

impl Absent {
    pub fn run(self, command: &str) -> anyhow::Result<()> {
        anyhow::bail!(
            "`{command}` needs the collector built with its `analysis` feature (Parquet/CSV and the fleet report; \
             on by default, left out of scripts/demo.sh's build): cargo build --release -p railguard-collector"
        )
    }
}
