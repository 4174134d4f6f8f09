//! `ledger cells move`, `ledger cells moves`, `ledger cells cancel` and `ledger cells add`
//! (ADR 0023 §1, §4): the partition moves and a cell's addition, asked of the running ledger's admin routes (`front::moves`) with an admin
//! token this command mints from the same secret `ledger token` uses. The process that serves
//! the cells runs the move: it holds every cell's database and spot-core, and its move worker
//! resumes a move after any restart. `move` waits and prints each step until the move ends
//! (`--no-wait`: only starts it); ctrl-c stops the waiting, never the move.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use domain::UserId;
use edge::auth::mint;
use serde_json::{json, Value};

use crate::config;
use crate::settings::{SecretFlags, SecretSettings};

/// Where the running ledger is and how to speak to it as an admin.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// The running ledger's API.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub api: String,
    /// The data dir whose stored secret to use when LEDGER_JWT_SECRET is unset.
    #[arg(long, default_value = "./.ledger")]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub secrets: SecretFlags,
}

#[derive(Debug, Args)]
pub struct MoveArgs {
    /// The partition to move (0 to 255).
    #[arg(long)]
    pub partition: u64,
    /// The cell to move it to.
    #[arg(long)]
    pub to: u64,
    /// Start the move and return; the ledger drives it.
    #[arg(long)]
    pub no_wait: bool,
    #[command(flatten)]
    pub api: ApiArgs,
}

#[derive(Debug, Args)]
pub struct MovesArgs {
    /// Print the moves as one JSON document.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub api: ApiArgs,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The move's id (`ledger cells moves` lists them).
    #[arg(long = "move")]
    pub id: String,
    #[command(flatten)]
    pub api: ApiArgs,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The new cell's database (`ledger up --cells N` makes one beside the others' when left
    /// out).
    #[arg(long)]
    pub database_url: Option<String>,
    /// Its spot-core, `HOST:PORT` (`ledger up --cells N` starts a child when left out).
    #[arg(long)]
    pub spot: Option<String>,
    /// The file holding its spot-core's token.
    #[arg(long)]
    pub spot_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// An admin's client of the running ledger.
struct Admin {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Admin {
    fn new(args: &ApiArgs, secrets: &SecretSettings) -> anyhow::Result<Self> {
        let secret = match secrets.jwt.clone() {
            Some(secret) => secret,
            None => config::secret_from_file(&args.data_dir)?.with_context(|| {
                format!(
                    "no secret: set {} or give the --data-dir of `ledger up`",
                    config::JWT_SECRET_ENV
                )
            })?,
        };
        let admin = UserId::new(1).expect("1 is a user id");
        Ok(Self {
            http: reqwest::Client::new(),
            base: format!("{}/api/v1/admin/cells", args.api.trim_end_matches('/')),
            token: mint(&secret.bytes, admin, true, Duration::from_secs(600)),
        })
    }

    async fn call(&self, post: Option<Value>, path: &str) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let request = match post {
            Some(body) => self.http.post(&url).json(&body),
            None => self.http.get(&url),
        };
        let answer = request
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("the ledger at {url}"))?;
        let status = answer.status();
        let body: Value = answer.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!(
                "{status}: {}",
                body["message"].as_str().unwrap_or(&body.to_string())
            );
        }
        Ok(body)
    }
}

/// `ledger cells move`.
pub async fn start(args: MoveArgs, secrets: &SecretSettings) -> anyhow::Result<()> {
    let admin = Admin::new(&args.api, secrets)?;
    let started = admin
        .call(
            Some(json!({"partition": args.partition, "to": args.to})),
            "/moves",
        )
        .await?;
    let id = started["id"]
        .as_str()
        .ok_or_else(|| anyhow!("the ledger answered no move id: {started}"))?
        .to_owned();
    println!(
        "move {id}: partition {} from cell {} to cell {} (map version {})",
        started["partition"], started["from"], started["to"], started["map_version"]
    );
    if args.no_wait {
        return Ok(());
    }
    let began = Instant::now();
    let mut last = String::new();
    loop {
        let record = admin.call(None, &format!("/moves/{id}")).await?;
        let step = record["step"].as_str().unwrap_or("?").to_owned();
        if step != last {
            println!(
                "{:>8} ms  {step}  (copied {}, passes {})",
                began.elapsed().as_millis(),
                record["copied"],
                record["passes"]
            );
            last = step.clone();
        }
        match step.as_str() {
            "DONE" => return Ok(()),
            "CANCELLED" => bail!(
                "the move was cancelled: {}",
                record["reason"].as_str().unwrap_or("no reason given")
            ),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// `ledger cells moves`.
pub async fn list(args: MovesArgs, secrets: &SecretSettings) -> anyhow::Result<()> {
    let moves = Admin::new(&args.api, secrets)?.call(None, "/moves").await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&moves)?);
        return Ok(());
    }
    let rows = moves["moves"].as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        println!("no moves");
    }
    for m in rows {
        println!(
            "{}  partition {:>3}  cell {} → {}  {:<11}  copied {}{}",
            m["id"].as_str().unwrap_or("?"),
            m["partition"],
            m["from"],
            m["to"],
            m["step"].as_str().unwrap_or("?"),
            m["copied"],
            m["reason"]
                .as_str()
                .map(|r| format!("  ({r})"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// `ledger cells cancel`.
pub async fn cancel(args: CancelArgs, secrets: &SecretSettings) -> anyhow::Result<()> {
    let record = Admin::new(&args.api, secrets)?
        .call(Some(json!({})), &format!("/moves/{}/cancel", args.id))
        .await?;
    println!(
        "move {}: {} (the ledger rolls it back)",
        args.id,
        record["step"].as_str().unwrap_or("?")
    );
    Ok(())
}

/// `ledger cells add`.
pub async fn add(args: AddArgs, secrets: &SecretSettings) -> anyhow::Result<()> {
    let admin = Admin::new(&args.api, secrets)?;
    let mut body = serde_json::Map::new();
    if let Some(url) = &args.database_url {
        body.insert("database_url".into(), json!(url));
    }
    if let Some(spot) = &args.spot {
        body.insert("spot".into(), json!(spot));
    }
    if let Some(file) = &args.spot_token_file {
        body.insert("spot_token_file".into(), json!(file.display().to_string()));
    }
    let added = admin.call(Some(Value::Object(body)), "").await?;
    println!(
        "cell {} added (map version {}): database {}, spot-core {}; it owns no partition: \
         move some to it with `ledger cells move --partition P --to {}`",
        added["cell"],
        added["map_version"],
        added["database"].as_str().unwrap_or("?"),
        added["spot"].as_str().unwrap_or("?"),
        added["cell"],
    );
    Ok(())
}
