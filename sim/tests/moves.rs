//! `ledger-sim --moves` (`sim::moves`): partition moves among faults. A bounded run of seeds
//! over three cells ends every move (some DONE, some CANCELLED) with no violation; the planted
//! bug `write-after-pause` (the source accepts a write after the pause began) is found within
//! its budget; one seed replays byte for byte.

use application::plant::Bug;
use sim::moves::{run, Config};

fn config(plant: Option<Bug>, trace: bool) -> Config {
    Config {
        cells: 3,
        plant,
        trace,
    }
}

#[test]
fn moves_among_faults_end_with_every_cell_whole() {
    let (mut moves, mut done, mut cancelled) = (0, 0, 0);
    let mut crashes = 0;
    for seed in 0..300 {
        let report = run(seed, &config(None, false));
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?} (replay: ledger-sim --moves --seed {seed} --trace)",
            report.violations
        );
        assert_eq!(report.done + report.cancelled, report.moves, "seed {seed}");
        moves += report.moves;
        done += report.done;
        cancelled += report.cancelled;
        crashes += report.counts.get("crashes").copied().unwrap_or(0);
    }
    assert!(moves > 300, "moves ran: {moves}");
    assert!(
        done > 0 && cancelled > 0,
        "{done} DONE, {cancelled} CANCELLED"
    );
    assert!(crashes > 0, "runners crashed mid-move");
}

/// Found at seed 0 when written (the check before the switch, or the books after it).
#[test]
fn the_source_accepting_a_write_after_the_pause_is_found() {
    let planted = config(Some(Bug::WriteAfterPause), false);
    let found = (0..100).find(|seed| !run(*seed, &planted).violations.is_empty());
    assert!(found.is_some(), "write-after-pause not found in 100 seeds");
}

#[test]
fn one_moves_seed_replays_byte_for_byte() {
    for seed in [3, 1999] {
        let first = run(seed, &config(None, true));
        let second = run(seed, &config(None, true));
        assert!(first.trace.len() > 10, "a trace says what happened");
        assert_eq!(first.trace, second.trace);
        assert_eq!(first.counts, second.counts);
    }
    let planted = config(Some(Bug::WriteAfterPause), true);
    assert_eq!(run(5, &planted).trace, run(5, &planted).trace);
}
