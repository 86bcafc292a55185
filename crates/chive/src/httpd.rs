//! `chive httpd` (under construction).

/// Command-line arguments of `chive httpd`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// TOML config file.
    #[arg(long)]
    pub config: std::path::PathBuf,
}

/// Run `chive httpd`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("chive httpd is not built yet")
}
