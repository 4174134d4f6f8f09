//! Replays every kept fuzz input as an ordinary test on the stable toolchain, through the same
//! property functions the libFuzzer targets run: each target's minimized corpus
//! (`fuzz/corpus/<target>/`) and every crash found, minimized and fixed
//! (`fuzz/regressions/<target>/`). A target without a corpus fails: it was never run.

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files of `dir`, sorted; none when it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(target: &str) {
    let corpus = inputs(&fuzz_dir().join("corpus").join(target));
    assert!(
        !corpus.is_empty(),
        "fuzz/corpus/{target}/ is missing or empty: run scripts/fuzz to make it"
    );
    let regressions = inputs(&fuzz_dir().join("regressions").join(target));
    for path in corpus.iter().chain(&regressions) {
        let data = std::fs::read(path).expect("a readable input");
        let outcome = std::panic::catch_unwind(|| fuzz_props::run(target, &data));
        match outcome {
            Ok(known) => assert!(known, "no property function for {target}"),
            Err(_) => panic!("{target}: {} fails its properties", path.display()),
        }
    }
    eprintln!(
        "{target}: {} corpus inputs and {} regressions hold",
        corpus.len(),
        regressions.len()
    );
}

#[test]
fn atk_fuzz_replay_amount() {
    replay("amount");
}

#[test]
fn atk_fuzz_replay_transfer_body() {
    replay("transfer_body");
}

#[test]
fn atk_fuzz_replay_jwt() {
    replay("jwt");
}

#[test]
fn atk_fuzz_replay_graphql() {
    replay("graphql");
}

#[test]
fn atk_fuzz_replay_protocol_line() {
    replay("protocol_line");
}

#[test]
fn cra_fuzz_replay_wal_segment() {
    replay("wal_segment");
}

#[test]
fn cra_fuzz_replay_snapshot() {
    replay("snapshot");
}

#[test]
fn every_target_has_a_fuzz_target_file() {
    for target in fuzz_props::TARGETS {
        let file = fuzz_dir().join("fuzz_targets").join(format!("{target}.rs"));
        assert!(file.is_file(), "{} is missing", file.display());
    }
}
