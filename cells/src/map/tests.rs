//! The cell map's forms and each refusal of its validation.

use super::*;

const TOML: &str = r#"
partitions = 256

[[cells]]
id = 1
database_url = "postgres://ledger@db1:5432,db1b:5432/ledger"
spot = "10.0.1.10:7400"
spot_token_file = "/etc/ledger/spot-1.token"
partitions = ["0-84"]

[[cells]]
id = 2
database_url = "postgres://ledger@db2:5432/ledger"
spot = "10.0.2.10:7400"
partitions = ["85-169"]

[[cells]]
id = 3
database_url = "postgres://ledger@db3:5432/ledger"
spot = "start"
partitions = ["170-200", "201", "202-255"]
"#;

const JSON: &str = r#"{
  "partitions": 256,
  "cells": [
    {"id": 1, "database_url": "postgres://ledger@db1:5432,db1b:5432/ledger",
     "spot": "10.0.1.10:7400", "spot_token_file": "/etc/ledger/spot-1.token",
     "partitions": ["0-84"]},
    {"id": 2, "database_url": "postgres://ledger@db2:5432/ledger",
     "spot": "10.0.2.10:7400", "partitions": ["85-169"]},
    {"id": 3, "database_url": "postgres://ledger@db3:5432/ledger",
     "spot": "start", "partitions": ["170-200", "201", "202-255"]}
  ]
}"#;

fn cell(n: u64) -> CellId {
    CellId::new(n).unwrap()
}

fn refused(text: &str) -> MapError {
    CellMap::parse(text, MapFormat::Toml).unwrap_err()
}

/// A TOML map of cells given as `(id, database, spot, partitions)`.
fn toml_of(cells: &[(u64, &str, &str, &[&str])]) -> String {
    let mut text = String::from("partitions = 256\n");
    for (id, db, spot, parts) in cells {
        let parts: Vec<String> = parts.iter().map(|p| format!("{p:?}")).collect();
        text.push_str(&format!(
            "[[cells]]\nid = {id}\ndatabase_url = {db:?}\nspot = {spot:?}\npartitions = [{}]\n",
            parts.join(", ")
        ));
    }
    text
}

#[test]
fn the_toml_and_json_forms_read_the_same_map() {
    let toml = CellMap::parse(TOML, MapFormat::Toml).unwrap();
    let json = CellMap::parse(JSON, MapFormat::Json).unwrap();
    assert_eq!(toml, json);
    assert_eq!(toml.cells().len(), 3);
    assert_eq!(toml.owner(Partition::new(84).unwrap()), cell(1));
    assert_eq!(toml.owner(Partition::new(85).unwrap()), cell(2));
    assert_eq!(toml.owner(Partition::new(201).unwrap()), cell(3));
    assert_eq!(toml.owner(Partition::new(255).unwrap()), cell(3));
    let first = toml.cell(cell(1)).unwrap();
    assert_eq!(first.spot, SpotAddress::At("10.0.1.10:7400".into()));
    assert_eq!(
        first.spot_token_file.as_deref(),
        Some(Path::new("/etc/ledger/spot-1.token"))
    );
    assert_eq!(toml.cell(cell(3)).unwrap().spot, SpotAddress::Start);
    assert_eq!(toml.cell(cell(2)).unwrap().spot_token_file, None);
}

#[test]
fn cells_come_out_in_id_order() {
    let text = toml_of(&[(9, "d9", "s9", &["0-9"]), (2, "d2", "s2", &["10-255"])]);
    let map = CellMap::parse(&text, MapFormat::Toml).unwrap();
    let ids: Vec<u16> = map.cells().iter().map(|c| c.id.get()).collect();
    assert_eq!(ids, vec![2, 9]);
}

#[test]
fn the_format_is_the_files_extension() {
    assert_eq!(
        MapFormat::of_path(Path::new("cells.toml")).unwrap(),
        MapFormat::Toml
    );
    assert_eq!(
        MapFormat::of_path(Path::new("/x/cells.json")).unwrap(),
        MapFormat::Json
    );
    assert!(matches!(
        MapFormat::of_path(Path::new("cells.yaml")),
        Err(MapError::UnknownFormat(_))
    ));
}

#[test]
fn another_partition_count_is_refused() {
    let text = toml_of(&[(1, "d", "s", &["0-255"])]).replace("256", "128");
    assert!(matches!(refused(&text), MapError::PartitionCount(128)));
}

#[test]
fn a_map_without_cells_is_refused() {
    assert!(matches!(
        refused("partitions = 256\ncells = []\n"),
        MapError::NoCells
    ));
}

#[test]
fn unknown_fields_are_refused() {
    let text = toml_of(&[(1, "d", "s", &["0-255"])]).replace("spot =", "spotcore =");
    assert!(matches!(refused(&text), MapError::Toml(_)));
}

#[test]
fn cell_ids_are_unique_and_in_range() {
    let twice = toml_of(&[(1, "d1", "s1", &["0-9"]), (1, "d2", "s2", &["10-255"])]);
    assert!(matches!(refused(&twice), MapError::DuplicateCell(c) if c == cell(1)));
    let zero = toml_of(&[(0, "d", "s", &["0-255"])]);
    assert!(matches!(refused(&zero), MapError::CellIdOutOfRange(0)));
    let big = toml_of(&[(70_000, "d", "s", &["0-255"])]);
    assert!(matches!(refused(&big), MapError::CellIdOutOfRange(70_000)));
}

#[test]
fn urls_and_spot_addresses_are_present() {
    let no_db = toml_of(&[(1, " ", "s", &["0-255"])]);
    assert!(matches!(refused(&no_db), MapError::NoDatabaseUrl(c) if c == cell(1)));
    let no_spot = toml_of(&[(1, "d", "", &["0-255"])]);
    assert!(matches!(refused(&no_spot), MapError::NoSpot(c) if c == cell(1)));
}

#[test]
fn two_cells_never_share_a_database_or_a_spot_core() {
    let db = toml_of(&[(1, "d", "s1", &["0-9"]), (2, "d", "s2", &["10-255"])]);
    assert!(matches!(refused(&db), MapError::SharedDatabase(a, b) if a == cell(1) && b == cell(2)));
    let spot = toml_of(&[(1, "d1", "s", &["0-9"]), (2, "d2", "s", &["10-255"])]);
    assert!(matches!(refused(&spot), MapError::SharedSpot(a, b) if a == cell(1) && b == cell(2)));
    // Two cells that `ledger up` starts each get a spot-core of their own.
    let started = toml_of(&[
        (1, "d1", "start", &["0-9"]),
        (2, "d2", "start", &["10-255"]),
    ]);
    assert!(CellMap::parse(&started, MapFormat::Toml).is_ok());
}

#[test]
fn every_partition_is_assigned_exactly_once() {
    let twice = toml_of(&[(1, "d1", "s1", &["0-100"]), (2, "d2", "s2", &["100-255"])]);
    match refused(&twice) {
        MapError::PartitionTwice {
            partition,
            first,
            second,
        } => {
            assert_eq!(partition.get(), 100);
            assert_eq!((first, second), (cell(1), cell(2)));
        }
        other => panic!("{other}"),
    }
    let gap = toml_of(&[(1, "d1", "s1", &["0-99"]), (2, "d2", "s2", &["101-255"])]);
    assert!(matches!(refused(&gap), MapError::PartitionUnassigned(p) if p.get() == 100));
    assert_eq!(
        refused(&gap).to_string(),
        "partition 100 is assigned to no cell"
    );
}

#[test]
fn partition_ranges_are_in_bounds_and_ascending() {
    for bad in ["0-256", "300", "9-3", "a-b", "", "-5"] {
        let text = toml_of(&[(1, "d", "s", &[bad, "0-255"])]);
        assert!(
            matches!(refused(&text), MapError::BadPartitions { ref text, .. } if text == bad),
            "{bad:?}"
        );
    }
}

const HA_TOML: &str = r#"
partitions = 256

[[cells]]
id = 1
database_url = "postgres://ledger@db1:5432,db1b:5432/ledger?patroni=http://db1:8008,http://db1b:8008"
spot = "10.0.1.10:7400,10.0.1.11:7400,10.0.1.12:7400"
partitions = ["0-255"]

[[cells.members]]
kind = "postgres"
name = "pg1"
address = "db1:5432"
control = "http://db1:8008"

[[cells.members]]
kind = "spot-core"
name = "r1"
address = "10.0.1.10:7400"
control = "10.0.1.10:7500"

[[cells.members]]
kind = "spot-core"
name = " r2 "
address = "10.0.1.11:7400"
"#;

#[test]
fn a_cell_names_its_members_under_ha() {
    let map = CellMap::parse(HA_TOML, MapFormat::Toml).unwrap();
    let members = &map.cell(cell(1)).unwrap().members;
    assert_eq!(members.len(), 3);
    assert_eq!(members[0].kind, MemberKind::Postgres);
    assert_eq!(members[0].control.as_deref(), Some("http://db1:8008"));
    assert_eq!(members[1].kind.as_str(), "spot-core");
    assert_eq!(members[2].name, "r2");
    assert_eq!(members[2].control, None);
    // The JSON form reads the same.
    let json = r#"{"partitions": 256, "cells": [{"id": 1,
        "database_url": "postgres://ledger@db1:5432,db1b:5432/ledger?patroni=http://db1:8008,http://db1b:8008",
        "spot": "10.0.1.10:7400,10.0.1.11:7400,10.0.1.12:7400", "partitions": ["0-255"],
        "members": [
          {"kind": "postgres", "name": "pg1", "address": "db1:5432", "control": "http://db1:8008"},
          {"kind": "spot-core", "name": "r1", "address": "10.0.1.10:7400", "control": "10.0.1.10:7500"},
          {"kind": "spot-core", "name": "r2", "address": "10.0.1.11:7400"}]}]}"#;
    assert_eq!(CellMap::parse(json, MapFormat::Json).unwrap(), map);
    // Without members, none.
    let plain = toml_of(&[(1, "d1", "s1", &["0-255"])]);
    assert!(CellMap::parse(&plain, MapFormat::Toml).unwrap().cells()[0]
        .members
        .is_empty());
}

#[test]
fn a_member_is_named_addressed_and_of_a_known_kind() {
    let with = |member: &str| {
        format!(
            "{}\n[[cells.members]]\n{member}\n",
            toml_of(&[(1, "d1", "s1", &["0-255"])])
        )
    };
    let nameless = with("kind = \"postgres\"\nname = \" \"\naddress = \"h:1\"");
    assert!(matches!(
        refused(&nameless),
        MapError::BadMember {
            why: "has no name",
            ..
        }
    ));
    let no_port = with("kind = \"postgres\"\nname = \"a\"\naddress = \"h\"");
    assert!(matches!(refused(&no_port), MapError::BadMember { .. }));
    let unknown = with("kind = \"etcd\"\nname = \"a\"\naddress = \"h:1\"");
    assert!(matches!(refused(&unknown), MapError::Toml(_)));
    let extra = with("kind = \"postgres\"\nname = \"a\"\naddress = \"h:1\"\nrole = \"leader\"");
    assert!(matches!(refused(&extra), MapError::Toml(_)));
    let twice = format!(
        "{}\n[[cells.members]]\nkind = \"spot-core\"\nname = \"r1\"\naddress = \"h:2\"\n",
        with("kind = \"spot-core\"\nname = \"r1\"\naddress = \"h:1\"")
    );
    assert_eq!(
        refused(&twice).to_string(),
        "cell 1: member \"r1\": is named twice"
    );
}
