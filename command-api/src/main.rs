//! The `ledger` binary; everything it does lives in `command_api::cli`.

use clap::Parser;

/// glibc's malloc and free were about an eighth of this process's CPU under load (perf, with
/// `ledger-bench transfers`); mimalloc's thread-local free lists cost less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    command_api::cli::init_tracing();
    command_api::cli::run(command_api::cli::Cli::parse()).await
}
