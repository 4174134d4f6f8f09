//! `cargo run -p tests --bin chaos -- [TRANSFERS] [CRASHES]`: the chaos run against the machine's
//! PostgreSQL (`TEST_DATABASE_SERVER`, default postgres://postgres@127.0.0.1:5432) with the
//! `ledger` and `spot-core` binaries built beside this one. Exits non-zero unless every figure
//! that must be zero is.

use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let transfers = args.next().map_or(Ok(1_000), |a| a.parse())?;
    let crashes_min = args.next().map_or(Ok(20), |a| a.parse())?;
    let exe = std::env::current_exe()?;
    let bin_dir = exe
        .parent()
        .ok_or_else(|| anyhow::anyhow!("no bin dir"))?
        .to_path_buf();
    let config = tests::chaos::Config {
        transfers,
        crashes_min,
        users: 20,
        clients: 16,
        ledgers: 2,
        kill_ledgers: true,
        kill_spot: true,
        bin_dir,
        server_url: std::env::var("TEST_DATABASE_SERVER")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned()),
        settle_max: Duration::from_secs(300),
    };
    println!(
        "chaos: {transfers} transfers, at least {crashes_min} crashes (ledger serve ×2 and spot-core, SIGKILL)"
    );
    let report = tests::chaos::run(config).await?;
    println!("{report}");
    if !report.clean() {
        anyhow::bail!("the chaos run found problems");
    }
    Ok(())
}
