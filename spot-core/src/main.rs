//! The `spot-core` binary: the SPOT account engine as its own process.

/// The same allocator as the ledger (see `ledger/src/main.rs`): per-request allocations are
/// cheaper than with glibc's malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    // The command line and the environment are read here, once (`Args` names the variables).
    let args = <spot_core::Args as clap::Parser>::parse();
    spot_core::main_entry(args)
}
