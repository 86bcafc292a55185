//! Replays every checked-in seed (`fuzz/seeds/<target>/`) and regression input
//! (`fuzz/regressions/<target>/`) through its target, on stable, as part of `make test`.

use std::path::{Path, PathBuf};

use chive_fuzz_targets::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Files directly in `dir` (none if it does not exist), sorted for a stable order.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_seed_and_regression_input_passes_its_target() {
    let mut replayed = 0;
    for (name, target) in TARGETS {
        let seeds = inputs(&fuzz_dir().join("seeds").join(name));
        assert!(
            !seeds.is_empty(),
            "target {name} has no seeds in fuzz/seeds/{name}"
        );
        for file in seeds
            .iter()
            .chain(&inputs(&fuzz_dir().join("regressions").join(name)))
        {
            let data = std::fs::read(file).expect("readable input");
            // A panic names the target; the file is printed first so a failure is easy to rerun.
            eprintln!("replay {name} {}", file.display());
            target(&data);
            replayed += 1;
        }
    }
    eprintln!("replayed {replayed} inputs");
}

#[test]
fn regression_directories_name_real_targets() {
    if let Some(file) = inputs(&fuzz_dir().join("regressions")).first() {
        panic!(
            "stray file {} (inputs go in regressions/<target>/)",
            file.display()
        );
    }
    let Ok(dirs) = std::fs::read_dir(fuzz_dir().join("regressions")) else {
        return;
    };
    for d in dirs {
        let name = d.expect("readable directory entry").file_name();
        assert!(
            TARGETS.iter().any(|(t, _)| *t == name.to_string_lossy()),
            "fuzz/regressions/{name:?} is not a target"
        );
    }
}

#[test]
fn checked_in_seeds_match_the_generator() {
    // Seeds are made by the crates' own encoders; if a format changes, regenerate them
    // (`cargo run --release -p chive-fuzz-targets --bin gen-seeds`) rather than let them rot.
    for (target, name, bytes) in chive_fuzz_targets::seeds::all() {
        let path = fuzz_dir().join("seeds").join(target).join(&name);
        let on_disk = std::fs::read(&path).unwrap_or_default();
        assert!(
            on_disk == bytes,
            "{} is stale: regenerate the seeds",
            path.display()
        );
    }
}

#[test]
fn every_cargo_fuzz_target_is_replayed_here() {
    // `make fuzz` runs the `[[bin]]`s of fuzz/Cargo.toml; `make test` replays `TARGETS`. A
    // target added to one and not the other would be fuzzed but never replayed (or the reverse).
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    let mut bins: Vec<&str> = manifest
        .split("[[bin]]")
        .skip(1)
        .filter_map(|section| {
            section
                .lines()
                .find_map(|l| l.trim().strip_prefix("name = \""))
                .and_then(|rest| rest.strip_suffix('"'))
        })
        .collect();
    bins.sort_unstable();
    let mut names: Vec<&str> = TARGETS.iter().map(|(t, _)| *t).collect();
    names.sort_unstable();
    assert_eq!(bins, names, "fuzz/Cargo.toml's targets and TARGETS differ");
    for name in &bins {
        let wrapper = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        let text = std::fs::read_to_string(&wrapper).unwrap_or_default();
        assert!(
            text.contains(&format!("chive_fuzz_targets::{name}")),
            "{} does not call chive_fuzz_targets::{name}",
            wrapper.display()
        );
    }
}
