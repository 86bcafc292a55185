//! `chive perf` (under construction).

/// Command-line arguments of `chive perf`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// TOML config file.
    #[arg(long)]
    pub config: std::path::PathBuf,
}

/// Run `chive perf`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("chive perf is not built yet")
}
