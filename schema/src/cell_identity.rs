//! Which cell a database is (ADR 0017 §3): its id and the partition map as it last accepted it,
//! in `cell_identity` and `cell_partitions` (migration 0022), with the map's version (migration
//! 0028, ADR 0023). Start-up under a cell map writes
//! them into a fresh cell database and afterwards refuses a database whose stored identity or map
//! disagrees with the file's; start-up without a map refuses a database that is a cell of one.

use cells::{CellId, Partition, PartitionMismatch, Placement, PARTITIONS};
use sqlx::PgPool;

/// Why a database may not serve as the cell the start-up expects.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The map names this database for one cell, and the database is another's.
    #[error(
        "the cell map names this database ({database}) for cell {expected}, but it is cell \
         {stored}'s database: two cells never share a database"
    )]
    OtherCell {
        database: String,
        expected: CellId,
        stored: CellId,
    },
    /// The stored partition map differs from the file's.
    #[error("cell {cell}'s database ({database}) disagrees with the cell map: {mismatch}")]
    Partition {
        cell: CellId,
        database: String,
        mismatch: PartitionMismatch,
    },
    /// No map was given, and the database is a cell of one.
    #[error(
        "this database is cell {stored} of a cell map; serving it without --cell-map \
         (LEDGER_CELL_MAP) would place every user in it"
    )]
    MapMissing { stored: CellId },
    /// A stored value outside its checked range (the migration's checks forbid it).
    #[error("the stored cell identity is corrupt: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The stored identity of the database behind `pool`, if it has one.
pub async fn stored(pool: &PgPool) -> Result<Option<CellId>, IdentityError> {
    let raw: Option<i32> = sqlx::query_scalar("SELECT cell_id FROM cell_identity")
        .fetch_optional(pool)
        .await?;
    raw.map(|raw| {
        u64::try_from(raw)
            .ok()
            .and_then(CellId::new)
            .ok_or_else(|| IdentityError::Corrupt(format!("cell_id {raw}")))
    })
    .transpose()
}

/// The version of the cell map this database last accepted (ADR 0023 §1; migration 0028): 1
/// until a move or a cell's addition writes the next; `None` for a database that is no cell.
pub async fn map_version(pool: &PgPool) -> Result<Option<u64>, IdentityError> {
    let raw: Option<i64> = sqlx::query_scalar("SELECT map_version FROM cell_identity")
        .fetch_optional(pool)
        .await?;
    raw.map(|raw| {
        u64::try_from(raw)
            .ok()
            .filter(|v| *v >= 1)
            .ok_or_else(|| IdentityError::Corrupt(format!("map_version {raw}")))
    })
    .transpose()
}

/// A cell added while the deployment served, as a cell stores it (`cell_cells`, migration 0032).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAddition {
    pub id: CellId,
    /// `None`: `ledger up`'s database beside the others'.
    pub database_url: Option<String>,
    /// `HOST:PORT` or `start`.
    pub spot: String,
    pub spot_token_file: Option<String>,
    /// The version of the map that first named it.
    pub map_version: u64,
}

/// `cell_cells`' columns: id, database_url, spot, spot_token_file, map_version.
type AdditionRow = (i32, Option<String>, String, Option<String>, i64);

/// The cells added to the map this database is a cell of, ascending by id (none for a database
/// that is no cell, or that has not been migrated that far).
pub async fn additions(pool: &PgPool) -> Result<Vec<StoredAddition>, IdentityError> {
    let rows: Vec<AdditionRow> = sqlx::query_as(
        "SELECT id, database_url, spot, spot_token_file, map_version FROM cell_cells ORDER BY id",
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(id, database_url, spot, spot_token_file, version)| {
            let id = u64::try_from(id)
                .ok()
                .and_then(CellId::new)
                .ok_or_else(|| IdentityError::Corrupt(format!("added cell id {id}")))?;
            let map_version = u64::try_from(version)
                .ok()
                .filter(|v| *v >= 1)
                .ok_or_else(|| {
                    IdentityError::Corrupt(format!("added cell map_version {version}"))
                })?;
            Ok(StoredAddition {
                id,
                database_url,
                spot,
                spot_token_file,
                map_version,
            })
        })
        .collect()
}

/// Without a cell map: the database must not be a cell of one.
pub async fn check_no_map(pool: &PgPool) -> Result<(), IdentityError> {
    match stored(pool).await? {
        Some(stored) => Err(IdentityError::MapMissing { stored }),
        None => Ok(()),
    }
}

/// Makes the database behind `pool` cell `cell` of `placement`, or checks that it is: a fresh
/// database gets the identity and the whole map in one transaction (two processes starting at
/// once: the second waits on the first's row, then checks it); one that has them must agree,
/// else the first difference is the error. `database` names it in errors (redacted URL).
pub async fn establish(
    pool: &PgPool,
    database: &str,
    cell: CellId,
    placement: &Placement,
) -> Result<(), IdentityError> {
    let mut tx = pool.begin().await?;
    let fresh = sqlx::query(
        "INSERT INTO cell_identity (cell_id, partitions) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    )
    .bind(i32::from(cell.get()))
    .bind(i32::from(PARTITIONS))
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if fresh {
        let (partitions, cells): (Vec<i16>, Vec<i32>) = Partition::all()
            .map(|p| (i16::from(p.get()), i32::from(placement.owner(p).get())))
            .unzip();
        sqlx::query(
            "INSERT INTO cell_partitions (partition, cell_id) \
             SELECT * FROM unnest($1::smallint[], $2::integer[])",
        )
        .bind(partitions)
        .bind(cells)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        tracing::info!(%cell, database, "cell identity and partition map stored");
        return Ok(());
    }
    tx.rollback().await?;
    check(pool, database, cell, placement).await
}

/// Compares the stored identity and map with the expected ones.
async fn check(
    pool: &PgPool,
    database: &str,
    cell: CellId,
    placement: &Placement,
) -> Result<(), IdentityError> {
    let stored_cell = stored(pool).await?.ok_or_else(|| {
        IdentityError::Corrupt("the identity row vanished while it was checked".into())
    })?;
    if stored_cell != cell {
        return Err(IdentityError::OtherCell {
            database: database.to_owned(),
            expected: cell,
            stored: stored_cell,
        });
    }
    let rows: Vec<(i16, i32)> =
        sqlx::query_as("SELECT partition, cell_id FROM cell_partitions ORDER BY partition")
            .fetch_all(pool)
            .await?;
    let mut kept = Vec::with_capacity(rows.len());
    for (partition, owner) in rows {
        let p = u64::try_from(partition).ok().and_then(Partition::new);
        let c = u64::try_from(owner).ok().and_then(CellId::new);
        match (p, c) {
            (Some(p), Some(c)) => kept.push((p, c)),
            _ => {
                return Err(IdentityError::Corrupt(format!(
                    "partition {partition} → cell {owner}"
                )))
            }
        }
    }
    match placement.first_difference(&kept) {
        None => Ok(()),
        // A map that moves changed (ADR 0023 §1): the cells' stored map is the truth once its
        // version passed the file's, and the front loads it; the file is only the seed.
        Some(mismatch) if map_version(pool).await?.is_some_and(|v| v > 1) => {
            tracing::warn!(%cell, database, ?mismatch, "the map file lags the cells' stored map (a partition moved); the stored map is routed by");
            Ok(())
        }
        Some(mismatch) => Err(IdentityError::Partition {
            cell,
            database: database.to_owned(),
            mismatch,
        }),
    }
}
