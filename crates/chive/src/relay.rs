//! `chive relay` (under construction).

/// Command-line arguments of `chive relay`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// TOML config file.
    #[arg(long)]
    pub config: std::path::PathBuf,
}

/// Run `chive relay`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("chive relay is not built yet")
}
