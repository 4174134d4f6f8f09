//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds the files at
//! compile time, and cargo does not otherwise watch a directory it was not told about.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
