//! The `ledger` binary; everything it does lives in `command_api::cli`.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    command_api::cli::init_tracing();
    command_api::cli::run(command_api::cli::Cli::parse()).await
}
