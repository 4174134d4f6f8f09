//! The acceptance map stays true: every id of `docs/contract.md`'s acceptance plan is carried by
//! a test, and `docs/acceptance.md` is what `scripts/acceptance` writes from the tests as they
//! are now. Needs only `python3`, no database.

use std::path::Path;
use std::process::Command;

#[test]
fn every_acceptance_id_has_a_test_and_the_map_is_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let out = Command::new("python3")
        .arg(root.join("scripts/acceptance"))
        .arg("--check")
        .current_dir(root)
        .output()
        .expect("run python3 scripts/acceptance --check");
    assert!(
        out.status.success(),
        "scripts/acceptance --check failed (run scripts/acceptance to rewrite docs/acceptance.md; \
         an id with no test needs one):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
