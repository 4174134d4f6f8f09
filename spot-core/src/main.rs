//! The `spot-core` binary: the SPOT account engine as its own process.

fn main() -> anyhow::Result<()> {
    spot_core::main_entry()
}
