//! Test harness: a fresh PostgreSQL database per test, a real spot-core process with its own
//! data directory, and a coordinator wired to both.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use adapters::{FundingLedger, SpotAdapter};
use application::{Coordinator, NewTransfer};
use domain::{AccountType, Amount, AssetRegistry, AssetSymbol, UserId};
use rust_decimal::Decimal;
use sqlx::PgPool;

/// The server every test database lives on.
pub fn server_url() -> String {
    crate::fd_census::install();
    std::env::var("TEST_DATABASE_SERVER")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned())
}

/// A database of its own for one test, migrated.
pub struct TestDb {
    /// The connection string, for child processes that need the same database.
    pub url: String,
    pub pool: PgPool,
    /// The database's name on the shared server; `None` for one on a private cluster, which
    /// goes with its cluster.
    name: Option<String>,
}

impl TestDb {
    pub async fn new() -> Self {
        let name = format!("it_{}", ulid::Ulid::new().to_string().to_lowercase());
        let url = format!("{}/{}", server_url(), name);
        let pool = schema::prepare(&url, 20)
            .await
            .expect("prepare test database");
        Self {
            url,
            pool,
            name: Some(name),
        }
    }

    /// A database of its own on a private cluster the test may stop (`tests::pg_solo`).
    pub async fn on_cluster(cluster: &tests::pg_solo::PgSolo) -> Self {
        let url = cluster.url("ledger_it");
        let pool = schema::prepare(&url, 20)
            .await
            .expect("prepare the private cluster's database");
        Self {
            url,
            pool,
            name: None,
        }
    }

    /// A database of its own migrated only up to (not including) `version`: an older ledger's
    /// database, for a test of what a later migration does to it (`sqlx migrate` then applies
    /// the rest when the ledger starts).
    pub async fn migrated_before(version: i64) -> Self {
        let name = format!("it_{}", ulid::Ulid::new().to_string().to_lowercase());
        let url = format!("{}/{}", server_url(), name);
        schema::ensure_database(&url)
            .await
            .expect("create test database");
        let pool = schema::connect(&url, 5)
            .await
            .expect("connect test database");
        let before = sqlx::migrate::Migrator {
            migrations: std::borrow::Cow::Owned(
                schema::MIGRATOR
                    .iter()
                    .filter(|m| m.version < version)
                    .cloned()
                    .collect(),
            ),
            ..sqlx::migrate::Migrator::DEFAULT
        };
        before
            .run(&pool)
            .await
            .unwrap_or_else(|e| panic!("migrations before {version}: {e}"));
        Self {
            url,
            pool,
            name: Some(name),
        }
    }
}

/// A test that passed takes its database with it (`tests::pg_ctl::drop_database`, as a clean
/// chaos run does): the server's data directory then holds what is live, not every test of the
/// run, and the `pg_restart` tests' stops once waited minutes on a busy disk for the 45,000 files
/// of the catalogue's leftovers. A failed test's database is kept to be looked at; `scripts/test`
/// drops leftovers before the next run.
impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(name) = self.name.clone() else {
            return;
        };
        if std::thread::panicking() {
            return;
        }
        // Its own thread and runtime: this may run inside the test's runtime, which cannot be
        // blocked on from within. `WITH (FORCE)` ends the connections of this pool and of any
        // child process still holding one.
        let dropping = name.clone();
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(tests::pg_ctl::drop_database(&server_url(), &dropping))
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("test database {name} not dropped: {e:#}");
        }
    }
}

/// Where the workspace's binaries are built: beside the test binary's `deps/` directory.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("target profile dir").to_path_buf()
}

/// The path of a workspace binary, building the workspace's binaries once if it is missing
/// (plain `cargo test` builds only the test's own dependencies' libraries).
pub fn bin(name: &str) -> PathBuf {
    crate::fd_census::install();
    static BUILT: OnceLock<()> = OnceLock::new();
    let path = bin_dir().join(name);
    if !path.exists() {
        BUILT.get_or_init(|| {
            let status = Command::new(env!("CARGO"))
                .args(["build", "--bins", "--workspace"])
                .status()
                .expect("run cargo build");
            assert!(status.success(), "cargo build --bins failed");
        });
    }
    assert!(path.exists(), "{} not found", path.display());
    path
}

/// A running spot-core process with a real WAL on disk, and a token of its own.
///
/// Tests start engines on port 0, side by side with other tests' (and other suites'), so the
/// port of an engine a test killed can be handed to another one before the test restarts it.
/// Every engine therefore requires its own random token in a `hello`: a client of this test that
/// reaches another engine at the same address fails to connect, instead of reading and moving
/// another test's money as if it were its own.
pub struct SpotProcess {
    pub data_dir: PathBuf,
    pub addr: String,
    /// The token this engine requires (`SPOT_CORE_TOKEN` for a child process).
    pub token: String,
    /// The cell this engine is (`SPOT_CORE_CELL_ID`), if it was started as one.
    pub cell: Option<u16>,
    /// More of its environment (the traces test's `OTEL_*`), kept for a restart.
    env: Vec<(String, String)>,
    child: Option<Child>,
    _tmp: Option<tempfile::TempDir>,
}

impl SpotProcess {
    pub fn start() -> Self {
        Self::start_on("127.0.0.1:0")
    }

    /// A new engine with its own data directory listening on `listen` (a test that plays
    /// another test's engine taking a freed port names the port).
    pub fn start_on(listen: &str) -> Self {
        Self::start_as(listen, None)
    }

    /// A new engine that is cell `cell` (ADR 0017): it refuses a client expecting another.
    pub fn start_cell(cell: u16) -> Self {
        Self::start_as("127.0.0.1:0", Some(cell))
    }

    /// A new engine with `env` added to its environment.
    pub fn start_with_env(env: &[(&str, &str)]) -> Self {
        let env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Self::start_as_with("127.0.0.1:0", None, env)
    }

    fn start_as(listen: &str, cell: Option<u16>) -> Self {
        Self::start_as_with(listen, cell, Vec::new())
    }

    fn start_as_with(listen: &str, cell: Option<u16>, env: Vec<(String, String)>) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data_dir = tmp.path().join("spot");
        let token = format!("it-spot-core-{}", ulid::Ulid::new());
        let (child, addr) = spawn_spot(&data_dir, listen, &token, cell, &env);
        Self {
            data_dir,
            addr,
            token,
            cell,
            env,
            child: Some(child),
            _tmp: Some(tmp),
        }
    }

    /// Kills the process with SIGKILL: no chance to flush or say goodbye.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL spot-core");
            child.wait().expect("reap spot-core");
        }
    }

    /// Starts it again on the same data directory and the same address.
    pub fn restart(&mut self) {
        self.kill();
        let (child, addr) = spawn_spot(
            &self.data_dir,
            &self.addr,
            &self.token,
            self.cell,
            &self.env,
        );
        assert_eq!(addr, self.addr);
        self.child = Some(child);
    }

    pub fn adapter(&self) -> SpotAdapter {
        SpotAdapter::with_token(
            self.addr.clone(),
            Duration::from_secs(3),
            Some(self.token.clone()),
        )
    }

    /// The environment a child process (`ledger serve`, `ledger audit`) needs to reach this
    /// engine: its token.
    pub fn env(&self) -> [(&'static str, &str); 1] {
        [(spot_core::TOKEN_ENV, self.token.as_str())]
    }
}

impl Drop for SpotProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn_spot(
    data_dir: &Path,
    listen: &str,
    token: &str,
    cell: Option<u16>,
    env: &[(String, String)],
) -> (Child, String) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut cmd = Command::new(bin("spot-core"));
        cmd.arg("--listen")
            .arg(listen)
            .arg("--data-dir")
            .arg(data_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .env(spot_core::TOKEN_ENV, token)
            .env_remove(spot_core::CELL_ID_ENV);
        if let Some(cell) = cell {
            cmd.env(spot_core::CELL_ID_ENV, cell.to_string());
        }
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd.spawn().expect("spawn spot-core");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).ok();
        if let Some(addr) = line.trim().strip_prefix("spot-core listening on ") {
            return (child, addr.to_owned());
        }
        // The old process's port may not be free yet after a kill; try again until the deadline.
        child.kill().ok();
        child.wait().ok();
        assert!(
            Instant::now() < deadline,
            "spot-core did not start: {line:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A database, a spot-core process and a coordinator over both.
/// FUNDING that applies a withdraw and then loses the answer: a crash between the adapter call
/// and recording its outcome, so the transfer stays SOURCE_PENDING with its withdraw applied.
pub struct WithdrawThenLoseAnswer(pub FundingLedger);

#[async_trait::async_trait]
impl domain::AccountPort for WithdrawThenLoseAnswer {
    fn account_type(&self) -> AccountType {
        AccountType::Funding
    }
    async fn withdraw(&self, m: &domain::Movement) -> domain::AdapterOutcome {
        assert_eq!(self.0.withdraw(m).await, domain::AdapterOutcome::Success);
        domain::AdapterOutcome::Timeout
    }
    async fn deposit(&self, m: &domain::Movement) -> domain::AdapterOutcome {
        self.0.deposit(m).await
    }
    async fn refund(&self, m: &domain::Movement) -> domain::AdapterOutcome {
        self.0.refund(m).await
    }
}

pub struct Stack {
    pub db: TestDb,
    pub spot: SpotProcess,
    pub funding: FundingLedger,
    pub spot_adapter: SpotAdapter,
    pub assets: Arc<RwLock<AssetRegistry>>,
    pub coordinator: Coordinator,
    /// The transfer read models over the same database.
    pub view: projections::TransferView,
}

impl Stack {
    pub async fn start() -> Self {
        Self::over(TestDb::new().await, SpotProcess::start())
    }

    /// The stack over a database and an engine the test started.
    pub fn over(db: TestDb, spot: SpotProcess) -> Self {
        let funding = FundingLedger::new(db.pool.clone());
        let spot_adapter = spot.adapter();
        let assets = Arc::new(RwLock::new(AssetRegistry::default_assets()));
        let coordinator = adapters::pg::coordinator(
            db.pool.clone(),
            Arc::new(funding.clone()),
            Arc::new(spot_adapter.clone()),
            assets.clone(),
        );
        let view = projections::TransferView::new(db.pool.clone());
        Self {
            db,
            spot,
            view,
            funding,
            spot_adapter,
            assets,
            coordinator,
        }
    }

    /// A second coordinator over the same database and spot-core, as another process would have.
    pub fn another_coordinator(&self) -> Coordinator {
        adapters::pg::coordinator(
            self.db.pool.clone(),
            Arc::new(self.funding.clone()),
            Arc::new(self.spot.adapter()),
            self.assets.clone(),
        )
    }

    /// `another_coordinator` whose log claims, charges and creates in separate steps (a log
    /// without claims of its own, ADR 0022).
    pub fn another_coordinator_apart(&self) -> Coordinator {
        let pool = self.db.pool.clone();
        let ports = application::Ports {
            log: Arc::new(adapters::pg::transfers::PgTransferLog::new(pool.clone()).apart()),
            ..adapters::pg::ports(pool)
        };
        Coordinator::with_ports(
            ports,
            Arc::new(self.funding.clone()),
            Arc::new(self.spot.adapter()),
            self.assets.clone(),
        )
    }

    /// `another_coordinator` whose log makes FUNDING's movements in the transaction of the
    /// events announcing and recording them (ADR 0024), as the ledger is wired.
    pub fn another_coordinator_funded(&self) -> Coordinator {
        let pool = self.db.pool.clone();
        Coordinator::with_ports(
            adapters::pg::ports_with_funding(pool, self.funding.clone()),
            Arc::new(self.funding.clone()),
            Arc::new(self.spot.adapter()),
            self.assets.clone(),
        )
    }

    /// Money from outside into FUNDING.
    pub async fn deposit(&self, user: u64, asset: &str, amount: &str) {
        self.funding
            .external_deposit(
                &format!("ext-{}", ulid::Ulid::new()),
                UserId::new(user).unwrap(),
                &AssetSymbol::parse(asset).unwrap(),
                Amount::parse(amount).unwrap(),
            )
            .await
            .expect("external deposit");
    }

    pub async fn funding_balance(&self, user: u64, asset: &str) -> Decimal {
        self.funding
            .balance(
                UserId::new(user).unwrap(),
                &AssetSymbol::parse(asset).unwrap(),
            )
            .await
            .unwrap()
            .unwrap_or_default()
    }

    pub async fn spot_balance(&self, user: u64, asset: &str) -> Decimal {
        self.spot_adapter
            .balances(UserId::new(user).unwrap())
            .await
            .expect("spot balances")
            .into_iter()
            .find(|b| b.asset == asset)
            .map(|b| b.available)
            .unwrap_or_default()
    }

    pub async fn in_flight(&self, user: u64, asset: &str) -> Decimal {
        self.view
            .in_flight(i64::try_from(user).unwrap())
            .await
            .unwrap()
            .into_iter()
            .find(|(a, _)| a == asset)
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    pub async fn external_total(&self, user: u64, asset: &str) -> Decimal {
        sqlx::query_scalar::<_, Option<Decimal>>(
            "SELECT SUM(amount) FROM external_deposits WHERE user_id = $1 AND asset = $2",
        )
        .bind(i64::try_from(user).unwrap())
        .bind(asset)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
        .unwrap_or_default()
    }

    /// Brings every projection up to the events committed so far (the projector runs apart from
    /// the coordinator, so a read model may lag the log by a few milliseconds).
    pub async fn wait_for_projections(&self) {
        let caught_up = projections::Projector::new(self.db.pool.clone())
            .catch_up(Duration::from_secs(30))
            .await
            .expect("projector");
        assert!(caught_up, "projections did not catch up within 30 s");
    }

    /// Contract §4, exact: reconciles both account systems' records by req_id with the
    /// events, system-wide, and fails on any difference or disagreeing transfer.
    pub async fn assert_invariant_exact(&self) {
        let report = adapters::pg::check_full(&self.funding, &self.spot_adapter)
            .await
            .expect("the fund-conservation check runs");
        assert!(report.ok, "fund conservation violated: {report:#?}");
    }

    /// Conservation for one user and asset: FUNDING + SPOT + in-flight = net deposits.
    pub async fn assert_conserved(&self, user: u64, asset: &str) {
        let funding = self.funding_balance(user, asset).await;
        let spot = self.spot_balance(user, asset).await;
        let in_flight = self.in_flight(user, asset).await;
        let external = self.external_total(user, asset).await;
        assert_eq!(
            funding + spot + in_flight,
            external,
            "conservation broken for user {user} {asset}: funding {funding} + spot {spot} + in-flight {in_flight} != deposits {external}"
        );
        // INV-001..003 also hold under the exact, req_id-reconciled check.
        self.assert_invariant_exact().await;
    }

    pub async fn transfer(
        &self,
        user: u64,
        from: AccountType,
        to: AccountType,
        asset: &str,
        amount: &str,
    ) -> domain::TransferData {
        self.coordinator
            .submit(NewTransfer {
                user_id: UserId::new(user).unwrap(),
                from,
                to,
                asset: AssetSymbol::parse(asset).unwrap(),
                amount: Amount::parse(amount).unwrap(),
                cid: None,
            })
            .await
            .expect("submit transfer")
    }

    /// The event types stored for one transfer, in order: each state change is a row.
    pub async fn event_types(&self, req_id: &str) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT event_type FROM events WHERE aggregate_type = 'Transfer' AND aggregate_id = $1
             ORDER BY sequence",
        )
        .bind(req_id)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }
}

pub fn dec(s: &str) -> Decimal {
    s.parse().unwrap()
}

/// The HMAC secret the in-process API verifies tokens with.
pub const JWT_SECRET: &[u8] = b"integration-test-secret-of-at-least-32-bytes";

/// A token every test server accepts (the in-process API and `ledger serve`, both verifying with
/// [`JWT_SECRET`]) for `user`, an admin's when `admin`; valid for an hour, longer than any test.
pub fn token(user: u64, admin: bool) -> String {
    edge::mint(
        JWT_SECRET,
        UserId::new(user).unwrap(),
        admin,
        Duration::from_secs(3600),
    )
}

/// A stack with the HTTP API served in-process on a free port.
pub struct ApiStack {
    pub stack: Stack,
    pub base: String,
    pub http: reqwest::Client,
}

impl ApiStack {
    pub async fn start() -> Self {
        Self::start_with_limits(edge::ratelimit::LimitsConfig::unlimited()).await
    }

    /// The same, with rate and daily limits applied.
    pub async fn start_with_limits(limits: edge::ratelimit::LimitsConfig) -> Self {
        let stack = Stack::start().await;
        let wiring = ledger::Wiring::new(
            stack.db.pool.clone(),
            stack.spot.adapter(),
            AssetRegistry::default_assets(),
            JWT_SECRET,
        )
        .with_limits(limits);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(ledger::serve_with(listener, wiring));
        Self {
            stack,
            base,
            http: reqwest::Client::new(),
        }
    }

    pub fn token(&self, user: u64, admin: bool) -> String {
        token(user, admin)
    }

    /// Sends a request and returns (status, JSON body).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut req = self.http.request(method, format!("{}{}", self.base, path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("http call");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        (status, json)
    }
}
