//! The admin views across cells (ADR 0017 §5, §11): the transfers list, the overview, the
//! alerts and the conservation check are asked of every cell at once and merged here; a cell
//! that is down (or failed to answer) is named in `down_cells` and the answer is `partial`.
//!
//! The transfers list keeps its keyset cursor stable across cells: the `next` of a merged page
//! names each cell's own position (`1:<cursor>,2:<cursor>,3:end`, each `<cursor>` the cell's own
//! keyset cursor, `end` a cell with nothing older), so the next page resumes every cell exactly
//! where this one stopped. A cell that was down keeps the position it had: its rows are shown
//! once it answers again, never skipped. A bare single-cell cursor applies to every cell.

use std::collections::BTreeMap;

use cells::CellId;
use serde_json::{json, Map, Value};

/// One cell's answer to a fan-out request: `Some((status, body))`, or `None` when it is down or
/// did not answer.
pub type Answers = BTreeMap<CellId, Option<(u16, Value)>>;

/// The cells that did not answer 200.
pub fn down_cells(answers: &Answers) -> Vec<u16> {
    answers
        .iter()
        .filter(|(_, a)| !matches!(a, Some((200, _))))
        .map(|(c, _)| c.get())
        .collect()
}

fn ok_bodies(answers: &Answers) -> impl Iterator<Item = (CellId, &Value)> {
    answers.iter().filter_map(|(c, a)| match a {
        Some((200, body)) => Some((*c, body)),
        _ => None,
    })
}

/// Marks `out` with `partial` and `down_cells`.
fn mark(out: &mut Value, answers: &Answers) {
    let down = down_cells(answers);
    out["partial"] = json!(!down.is_empty());
    out["down_cells"] = json!(down);
}

/// Each cell's position in a merged transfers listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// From the newest.
    Start,
    /// After this cell's own keyset cursor.
    After(String),
    /// Nothing older in this cell.
    End,
}

/// The positions an `after` names: a composite cursor (`1:<c>,2:end`), or a bare cursor that
/// applies to every cell; `None` for a composite that does not parse.
pub fn parse_positions(
    after: Option<&str>,
    cells: &[CellId],
) -> Option<BTreeMap<CellId, Position>> {
    let mut out: BTreeMap<CellId, Position> = cells.iter().map(|c| (*c, Position::Start)).collect();
    let Some(after) = after.filter(|a| !a.is_empty()) else {
        return Some(out);
    };
    if !after.contains(':') {
        for p in out.values_mut() {
            *p = Position::After(after.to_owned());
        }
        return Some(out);
    }
    for part in after.split(',') {
        let (cell, at) = part.split_once(':')?;
        let cell = CellId::new(cell.parse().ok()?)?;
        let slot = out.get_mut(&cell)?;
        *slot = match at {
            "end" => Position::End,
            "" => return None,
            cursor => Position::After(cursor.to_owned()),
        };
    }
    Some(out)
}

/// The composite cursor of `positions`; `None` when every cell is at its end.
pub fn encode_positions(positions: &BTreeMap<CellId, Position>) -> Option<String> {
    if positions.values().all(|p| *p == Position::End) {
        return None;
    }
    let parts: Vec<String> = positions
        .iter()
        .filter_map(|(cell, p)| match p {
            Position::Start => None,
            Position::After(c) => Some(format!("{cell}:{c}")),
            Position::End => Some(format!("{cell}:end")),
        })
        .collect();
    Some(parts.join(","))
}

/// The newest `limit` rows of every cell's page, newest first (`created_at`, then `req_id`,
/// both descending), each tagged with its cell; and how many of each cell's rows were taken.
pub fn merge_transfers(answers: &Answers, limit: usize) -> (Vec<Value>, BTreeMap<CellId, usize>) {
    let mut all: Vec<(CellId, Value)> = Vec::new();
    for (cell, body) in ok_bodies(answers) {
        for row in body["transfers"].as_array().into_iter().flatten() {
            let mut row = row.clone();
            row["cell"] = json!(cell.get());
            all.push((cell, row));
        }
    }
    let key = |row: &Value| {
        (
            row["created_at"].as_str().unwrap_or_default().to_owned(),
            row["req_id"].as_str().unwrap_or_default().to_owned(),
        )
    };
    all.sort_by_key(|(_, row)| std::cmp::Reverse(key(row)));
    all.truncate(limit);
    let mut taken: BTreeMap<CellId, usize> = BTreeMap::new();
    for (cell, _) in &all {
        *taken.entry(*cell).or_default() += 1;
    }
    (all.into_iter().map(|(_, row)| row).collect(), taken)
}

/// A merged transfers page.
pub fn transfers_page(rows: Vec<Value>, next: Option<String>, answers: &Answers) -> Value {
    let mut out = json!({ "transfers": rows, "next": next });
    mark(&mut out, answers);
    out
}

/// `GET /api/v1/admin/cells` across cells: each cell's own entry, in cell order; a cell that
/// did not answer is in `down_cells` (with `partial`) and has no entry.
pub fn cells(answers: &Answers) -> Value {
    let mut cells = Vec::new();
    for (_, body) in ok_bodies(answers) {
        cells.extend(body["cells"].as_array().into_iter().flatten().cloned());
    }
    let mut out = json!({ "cells": cells });
    mark(&mut out, answers);
    out
}

/// The overview of every cell and their total: counts and the last minute's rate summed, the
/// oldest open transfer over all cells, halted when a cell is, each cell's own overview under
/// `cells` (with `cell` and `state`), the lag the largest of any cell's.
pub fn overview(answers: &Answers, states: &[Value]) -> Value {
    let mut by_state: BTreeMap<String, i64> = BTreeMap::new();
    let mut rate = 0i64;
    let mut oldest: Option<(i64, Value)> = None;
    let mut halted = false;
    let mut reasons = Vec::new();
    let mut worst_check: Option<Value> = None;
    let mut cells = Vec::new();
    for (cell, body) in ok_bodies(answers) {
        for (state, n) in body["by_state"].as_object().into_iter().flatten() {
            *by_state.entry(state.clone()).or_default() += n.as_i64().unwrap_or(0);
        }
        rate += body["rate_last_minute"].as_i64().unwrap_or(0);
        if let Some(age) = body["oldest_open_age_ms"].as_i64() {
            if oldest.as_ref().is_none_or(|(a, _)| age > *a) {
                oldest = Some((age, body["oldest_open_req_id"].clone()));
            }
        }
        if body["halted"].as_bool() == Some(true) {
            halted = true;
            let reason = body["halt_reason"].as_str().unwrap_or("halted");
            reasons.push(format!("cell {cell}: {reason}"));
        }
        let check = &body["last_check"];
        let worse = match (&worst_check, check["ok"].as_bool()) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(w), Some(ok)) => !ok && w["ok"].as_bool() != Some(false),
        };
        if worse {
            worst_check = Some(check.clone());
        }
    }
    for state in states {
        let cell = state["cell"].as_u64().and_then(CellId::new);
        let mut entry = state.clone();
        if let Some(Some((200, body))) = cell.and_then(|c| answers.get(&c)) {
            for (k, v) in body.as_object().into_iter().flatten() {
                entry[k] = v.clone();
            }
        }
        cells.push(entry);
    }
    let mut out = json!({
        "by_state": by_state,
        "rate_last_minute": rate,
        "oldest_open_age_ms": oldest.as_ref().map(|(a, _)| *a),
        "oldest_open_req_id": oldest.map(|(_, r)| r).unwrap_or(Value::Null),
        "last_check": worst_check,
        "halted": halted,
        "halt_reason": if reasons.is_empty() { Value::Null } else { json!(reasons.join("; ")) },
        "lag": largest_lag(answers),
        "cells": cells,
    });
    mark(&mut out, answers);
    out
}

/// Each lag field, the largest any cell reports (`null` where none reports one).
fn largest_lag(answers: &Answers) -> Value {
    let mut out = Map::new();
    for (_, body) in ok_bodies(answers) {
        for (k, v) in body["lag"].as_object().into_iter().flatten() {
            let bigger = match (out.get(k).and_then(Value::as_f64), v.as_f64()) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(a), Some(b)) => b > a,
            };
            if bigger || !out.contains_key(k) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// The newest `limit` alerts of every cell, newest first, each with its cell.
pub fn alerts(answers: &Answers, limit: usize) -> Value {
    let mut all: Vec<Value> = Vec::new();
    for (cell, body) in ok_bodies(answers) {
        for alert in body["alerts"].as_array().into_iter().flatten() {
            let mut alert = alert.clone();
            alert["cell"] = json!(cell.get());
            all.push(alert);
        }
    }
    let key = |a: &Value| {
        (
            a["at"].as_str().unwrap_or_default().to_owned(),
            a["id"].as_i64(),
        )
    };
    all.sort_by_key(|alert| std::cmp::Reverse(key(alert)));
    all.truncate(limit);
    let mut out = json!({ "alerts": all });
    mark(&mut out, answers);
    out
}

/// Every cell's stuck transfers, oldest (longest unchanged) first, each with its cell, at most
/// `limit` (1 to 500, 100 when absent, as one cell brings it within).
pub fn stuck(answers: &Answers, limit: usize) -> Value {
    let mut all: Vec<Value> = Vec::new();
    for (cell, body) in ok_bodies(answers) {
        for row in body["transfers"].as_array().into_iter().flatten() {
            let mut row = row.clone();
            row["cell"] = json!(cell.get());
            all.push(row);
        }
    }
    all.sort_by_key(|row| std::cmp::Reverse(row["age_ms"].as_i64()));
    all.truncate(limit.clamp(1, 500));
    let mut out = json!({ "transfers": all });
    mark(&mut out, answers);
    out
}

/// Every cell's recent conservation checks, newest first (`at`, then the higher run id, then
/// the lower cell), at most `limit`; each names its `cell`, and its report's link (`report`)
/// names the cell too, since a run's id is its cell's own.
pub fn history(answers: &Answers, limit: usize) -> Value {
    let mut all: Vec<(CellId, Value)> = Vec::new();
    for (cell, body) in ok_bodies(answers) {
        for check in body["checks"].as_array().into_iter().flatten() {
            let mut check = check.clone();
            check["cell"] = json!(cell.get());
            if let Some(report) = check["report"].as_str() {
                check["report"] = json!(format!("{report}?cell={cell}"));
            }
            all.push((cell, check));
        }
    }
    let key = |c: &Value| {
        (
            c["at"].as_str().unwrap_or_default().to_owned(),
            c["id"].as_i64(),
        )
    };
    all.sort_by(|(cell_a, a), (cell_b, b)| key(b).cmp(&key(a)).then(cell_a.cmp(cell_b)));
    all.truncate(limit);
    let checks: Vec<Value> = all.into_iter().map(|(_, c)| c).collect();
    let mut out = json!({ "checks": checks });
    mark(&mut out, answers);
    out
}

/// The conservation check of every cell and the total: `ok` only when every cell answered and
/// is conserved, `halted` when any cell is, each cell's own report under `cells`, and the
/// per-asset sums of every cell's figures under `total` (the exact decimal strings added).
pub fn invariant(answers: &Answers) -> Value {
    let mut cells = Vec::new();
    let mut ok = true;
    let mut halted = false;
    let mut totals: BTreeMap<String, BTreeMap<String, rust_decimal::Decimal>> = BTreeMap::new();
    for (cell, answer) in answers {
        let Some((200, body)) = answer else {
            ok = false;
            cells.push(json!({"cell": cell.get(), "state": "down"}));
            continue;
        };
        ok &= body["ok"].as_bool() == Some(true);
        halted |= body["halted"].as_bool() == Some(true);
        add_asset_figures(&mut totals, body);
        let mut entry = body.clone();
        entry["cell"] = json!(cell.get());
        entry["state"] = json!("up");
        cells.push(entry);
    }
    let total: BTreeMap<String, BTreeMap<String, String>> = totals
        .into_iter()
        .map(|(asset, figures)| {
            let figures = figures
                .into_iter()
                .map(|(k, v)| (k, v.normalize().to_string()))
                .collect();
            (asset, figures)
        })
        .collect();
    let mut out = json!({ "ok": ok, "halted": halted, "cells": cells, "total": total });
    mark(&mut out, answers);
    out
}

/// Adds every decimal-string figure of each asset of one cell's report to `totals`.
fn add_asset_figures(
    totals: &mut BTreeMap<String, BTreeMap<String, rust_decimal::Decimal>>,
    body: &Value,
) {
    for asset in body["assets"].as_array().into_iter().flatten() {
        let Some(symbol) = asset["asset"].as_str() else {
            continue;
        };
        let figures = totals.entry(symbol.to_owned()).or_default();
        for (k, v) in asset.as_object().into_iter().flatten() {
            let Some(n) = v
                .as_str()
                .and_then(|s| s.parse::<rust_decimal::Decimal>().ok())
            else {
                continue;
            };
            *figures.entry(k.clone()).or_default() += n;
        }
    }
}

/// Adds `cell="N"` to every sample of one cell's OpenMetrics text and groups the samples by
/// family, so that every cell's samples of a family follow its one `# HELP`/`# TYPE` header.
pub fn relabel_metrics(
    families: &mut Vec<(String, Vec<String>, Vec<String>)>,
    cell: CellId,
    text: &str,
) {
    let mut current: Option<usize> = None;
    for line in text.lines() {
        if line == "# EOF" || line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let name = rest
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_owned();
            let at = match families.iter().position(|(n, _, _)| *n == name) {
                Some(at) => at,
                None => {
                    families.push((name, Vec::new(), Vec::new()));
                    families.len() - 1
                }
            };
            let meta = &mut families[at].1;
            if !meta.iter().any(|m| m == line) {
                meta.push(line.to_owned());
            }
            current = Some(at);
            continue;
        }
        let labelled = with_cell_label(line, cell);
        match current {
            Some(at) => families[at].2.push(labelled),
            None => families.push((String::new(), Vec::new(), vec![labelled])),
        }
    }
}

/// `name{a="b"} 1` → `name{cell="N",a="b"} 1`; `name 1` → `name{cell="N"} 1`.
fn with_cell_label(line: &str, cell: CellId) -> String {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let (name, rest) = line.split_at(name_end);
    match rest.strip_prefix('{') {
        Some(labels) if labels.starts_with('}') => format!("{name}{{cell=\"{cell}\"{labels}"),
        Some(labels) => format!("{name}{{cell=\"{cell}\",{labels}"),
        None => format!("{name}{{cell=\"{cell}\"}}{rest}"),
    }
}

/// The merged exposition: every family with its samples of every cell, then whether each cell
/// serves (`ledger_cell_up`), then `# EOF`.
pub fn metrics_text(
    families: &[(String, Vec<String>, Vec<String>)],
    up: &[(CellId, bool)],
) -> String {
    let mut out = String::new();
    for (_, meta, samples) in families {
        for line in meta.iter().chain(samples) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("# HELP ledger_cell_up Whether the cell serves: 1 when its database answers this process, 0 while its users are refused (503).\n");
    out.push_str("# TYPE ledger_cell_up gauge\n");
    for (cell, is_up) in up {
        out.push_str(&format!(
            "ledger_cell_up{{cell=\"{cell}\"}} {}\n",
            u8::from(*is_up)
        ));
    }
    out.push_str("# EOF\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(n: u16) -> CellId {
        CellId::new(u64::from(n)).unwrap()
    }

    #[test]
    fn a_cursor_names_each_cells_position() {
        let cells = [cell(1), cell(2), cell(3)];
        let positions = parse_positions(Some("1:100_A,3:end"), &cells).unwrap();
        assert_eq!(positions[&cell(1)], Position::After("100_A".into()));
        assert_eq!(positions[&cell(2)], Position::Start);
        assert_eq!(positions[&cell(3)], Position::End);
        assert_eq!(
            encode_positions(&positions).as_deref(),
            Some("1:100_A,3:end")
        );
        let bare = parse_positions(Some("100_A"), &cells).unwrap();
        assert!(bare.values().all(|p| *p == Position::After("100_A".into())));
        assert!(parse_positions(Some("9:100_A"), &cells).is_none());
        assert!(parse_positions(Some("1:"), &cells).is_none());
        let ended = cells.iter().map(|c| (*c, Position::End)).collect();
        assert_eq!(encode_positions(&ended), None);
    }

    #[test]
    fn rows_merge_newest_first_and_count_per_cell() {
        let page = |rows: &[(&str, &str)]| {
            let rows: Vec<Value> = rows
                .iter()
                .map(|(at, id)| json!({"created_at": at, "req_id": id}))
                .collect();
            Some((200, json!({ "transfers": rows })))
        };
        let mut answers = Answers::new();
        answers.insert(
            cell(1),
            page(&[
                ("2026-01-01T00:00:03.000Z", "C"),
                ("2026-01-01T00:00:01.000Z", "A"),
            ]),
        );
        answers.insert(cell(2), page(&[("2026-01-01T00:00:02.000Z", "B")]));
        answers.insert(cell(3), None);
        let (rows, taken) = merge_transfers(&answers, 2);
        let ids: Vec<&str> = rows.iter().map(|r| r["req_id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["C", "B"]);
        assert_eq!((taken[&cell(1)], taken[&cell(2)]), (1, 1));
        assert_eq!(rows[1]["cell"], 2);
        assert_eq!(down_cells(&answers), [3]);
    }

    #[test]
    fn every_sample_gains_its_cell() {
        let mut families = Vec::new();
        let text = "# HELP a A.\n# TYPE a gauge\na 1\na{state=\"X\"} 2\n# EOF\n";
        relabel_metrics(&mut families, cell(1), text);
        relabel_metrics(&mut families, cell(2), text);
        let out = metrics_text(&families, &[(cell(1), true), (cell(2), false)]);
        assert_eq!(
            out,
            "# HELP a A.\n# TYPE a gauge\na{cell=\"1\"} 1\na{cell=\"1\",state=\"X\"} 2\n\
             a{cell=\"2\"} 1\na{cell=\"2\",state=\"X\"} 2\n\
             # HELP ledger_cell_up Whether the cell serves: 1 when its database answers this process, 0 while its users are refused (503).\n\
             # TYPE ledger_cell_up gauge\nledger_cell_up{cell=\"1\"} 1\nledger_cell_up{cell=\"2\"} 0\n# EOF\n"
        );
    }

    #[test]
    fn stuck_rows_merge_oldest_first() {
        let page = |ages: &[i64]| {
            let rows: Vec<Value> = ages.iter().map(|a| json!({"age_ms": a})).collect();
            Some((200, json!({ "transfers": rows })))
        };
        let mut answers = Answers::new();
        answers.insert(cell(1), page(&[900, 100]));
        answers.insert(cell(2), page(&[500]));
        let out = stuck(&answers, 2);
        let ages: Vec<i64> = out["transfers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["age_ms"].as_i64().unwrap())
            .collect();
        assert_eq!(ages, [900, 500]);
        assert_eq!(out["transfers"][1]["cell"], 2);
    }

    #[test]
    fn checks_merge_newest_first_each_naming_its_cell() {
        let page = |checks: &[(&str, i64, bool)]| {
            let rows: Vec<Value> = checks
                .iter()
                .map(|(at, id, report)| {
                    let mut row = json!({"at": at, "id": id});
                    if *report {
                        row["report"] = json!(format!("/api/v1/admin/invariant/runs/{id}"));
                    }
                    row
                })
                .collect();
            Some((200, json!({ "checks": rows })))
        };
        let mut answers = Answers::new();
        answers.insert(
            cell(1),
            page(&[
                ("2026-01-01T00:00:03.000Z", 9, true),
                ("2026-01-01T00:00:01.000Z", 8, false),
            ]),
        );
        answers.insert(cell(2), page(&[("2026-01-01T00:00:02.000Z", 9, true)]));
        answers.insert(cell(3), None);
        let out = history(&answers, 2);
        let got: Vec<(i64, i64)> = out["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["cell"].as_i64().unwrap(), c["id"].as_i64().unwrap()))
            .collect();
        assert_eq!(got, [(1, 9), (2, 9)]);
        assert_eq!(
            out["checks"][1]["report"],
            "/api/v1/admin/invariant/runs/9?cell=2"
        );
        assert_eq!(
            (out["partial"].clone(), out["down_cells"].clone()),
            (json!(true), json!([3]))
        );
    }

    #[test]
    fn the_total_adds_each_assets_figures() {
        let mut answers = Answers::new();
        let report = |n: &str| json!({"ok": true, "halted": false, "assets": [{"asset": "USDT", "funding": n, "ok": true}]});
        answers.insert(cell(1), Some((200, report("1.5"))));
        answers.insert(cell(2), Some((200, report("2"))));
        let out = invariant(&answers);
        assert_eq!(out["total"]["USDT"]["funding"], "3.5");
        assert_eq!(
            (out["ok"].clone(), out["partial"].clone()),
            (json!(true), json!(false))
        );
        answers.insert(cell(3), None);
        assert_eq!(invariant(&answers)["ok"], false);
    }

    #[test]
    fn the_cells_view_joins_every_cells_entry_and_names_the_down_ones() {
        let mut answers = Answers::new();
        let one = CellId::new(1).unwrap();
        let two = CellId::new(2).unwrap();
        let three = CellId::new(3).unwrap();
        answers.insert(
            one,
            Some((200, json!({"cells": [{"cell": 1, "ha": true}]}))),
        );
        answers.insert(two, None);
        answers.insert(
            three,
            Some((200, json!({"cells": [{"cell": 3, "ha": false}]}))),
        );
        let merged = cells(&answers);
        assert_eq!(merged["cells"][0]["cell"], 1);
        assert_eq!(merged["cells"][1]["cell"], 3);
        assert_eq!(merged["partial"], true);
        assert_eq!(merged["down_cells"], json!([2]));
    }
}
