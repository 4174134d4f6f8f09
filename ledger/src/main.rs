//! The `ledger` binary; everything it does lives in `ledger::cli`.

use clap::Parser;

/// glibc's malloc and free were about an eighth of this process's CPU under load (perf, with
/// `ledger-bench transfers`); mimalloc's thread-local free lists cost less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    ledger::cli::run(ledger::cli::Cli::parse()).await
}
