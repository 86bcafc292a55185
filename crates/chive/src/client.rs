//! `chive client` (under construction).

/// Command-line arguments of `chive client`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// TOML config file.
    #[arg(long)]
    pub config: std::path::PathBuf,
}

/// Run `chive client`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("chive client is not built yet")
}
