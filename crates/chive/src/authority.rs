//! `chive authority` (under construction).

/// Command-line arguments of `chive authority`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// TOML config file.
    #[arg(long)]
    pub config: std::path::PathBuf,
}

/// Run `chive authority`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("chive authority is not built yet")
}
