//! The client keys' claims written inside a transaction the caller holds: `PgClientKeys`'s
//! claims (`transfers.rs`) and a creation's own claim in the appender's transaction
//! (`event_store/together.rs`, ADR 0022) share these statements.

use application::ports::CidClaim;

/// Claims each of `claims` (no `(user, cid)` twice) unless its key is claimed already, on
/// `conn` (in its transaction, if it is in one): whether each was claimed now, in order. The
/// event store's creations claim their keys this way in their own transaction (ADR 0022).
pub(crate) async fn claim_in(
    conn: &mut sqlx::PgConnection,
    claims: &[CidClaim],
) -> Result<Vec<bool>, sqlx::Error> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    // In key order, so two statements claiming overlapping keys wait on each other in the
    // same order and never deadlock.
    let mut sorted: Vec<&CidClaim> = claims.iter().collect();
    sorted.sort_by(|a, b| (a.user, &a.cid).cmp(&(b.user, &b.cid)));
    let users: Vec<i64> = sorted.iter().map(|c| c.user.as_i64()).collect();
    let cids: Vec<&str> = sorted.iter().map(|c| c.cid.as_str()).collect();
    let req_ids: Vec<String> = sorted.iter().map(|c| c.req_id.to_string()).collect();
    let fingerprints: Vec<&str> = sorted.iter().map(|c| c.fingerprint.as_str()).collect();
    // Each row inserted unless its key is claimed already (a concurrent claim of the same key
    // is waited for, as one INSERT waits).
    let inserted: Vec<(i64, String)> = sqlx::query_as(
        "INSERT INTO transfer_cids (user_id, cid, req_id, fingerprint)
         SELECT u, c, r, f
           FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[])
                WITH ORDINALITY AS t (u, c, r, f, n)
          ORDER BY n
         ON CONFLICT (user_id, cid) DO NOTHING
         RETURNING user_id, cid",
    )
    .bind(&users)
    .bind(&cids)
    .bind(&req_ids)
    .bind(&fingerprints)
    .fetch_all(conn)
    .await?;
    let inserted: std::collections::HashSet<(i64, String)> = inserted.into_iter().collect();
    Ok(claims
        .iter()
        .map(|c| inserted.contains(&(c.user.as_i64(), c.cid.clone())))
        .collect())
}

/// Takes back claims made by [`claim_in`] in the same transaction, for creations that were
/// not written after all (a daily limit refused them).
pub(crate) async fn unclaim_in(
    conn: &mut sqlx::PgConnection,
    claims: &[&CidClaim],
) -> Result<(), sqlx::Error> {
    if claims.is_empty() {
        return Ok(());
    }
    let users: Vec<i64> = claims.iter().map(|c| c.user.as_i64()).collect();
    let cids: Vec<&str> = claims.iter().map(|c| c.cid.as_str()).collect();
    let req_ids: Vec<String> = claims.iter().map(|c| c.req_id.to_string()).collect();
    sqlx::query(
        "DELETE FROM transfer_cids c
          USING unnest($1::bigint[], $2::text[], $3::text[]) AS t (u, k, r)
          WHERE c.user_id = t.u AND c.cid = t.k AND c.req_id = t.r",
    )
    .bind(&users)
    .bind(&cids)
    .bind(&req_ids)
    .execute(conn)
    .await?;
    Ok(())
}
