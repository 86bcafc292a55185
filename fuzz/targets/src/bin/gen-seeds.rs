//! Write every target's seed inputs to `<dir>/<target>/<name>` (default `fuzz/seeds`, relative
//! to the repository root), replacing what is there.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let root = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../seeds")));
    for (target, _) in chive_fuzz_targets::TARGETS {
        let dir = root.join(target);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
    }
    let seeds = chive_fuzz_targets::seeds::all();
    for (target, name, bytes) in &seeds {
        std::fs::write(root.join(target).join(name), bytes)?;
    }
    println!("wrote {} seeds under {}", seeds.len(), root.display());
    Ok(())
}
