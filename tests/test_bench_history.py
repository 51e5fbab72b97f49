"""bench/history.py: the headline ratios taken from committed summaries, and the section it writes (no git)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.history import END, START, MissingFigure, extract, rewrite, runs_of, section


def summary(run: str, commit: str, p50: float, http_8: float, http_32: float, suffix: str = "") -> dict[str, Any]:
    """A summary.json as bench/summary.py writes it, cut to what the history reads."""

    def figure(name: str, ratio: float) -> dict[str, Any]:
        return {"figure": name, "ratios": {"bastion/direct": ratio, "bastion/naive": 0.9}}

    def target(name: str, ratio: float, wanted: str, met: bool) -> dict[str, Any]:
        return {"target": name + suffix, "ratio": ratio, "wanted": wanted, "met": met}

    return {
        "measured": {
            "run": run,
            "commit": commit * 40,
            "uncommitted_changes": False,
            "date": "2026-11-26T12:03:06+00:00",
        },
        "figures": [
            figure("stdio latency p50, ms", p50),
            figure("HTTP calls/s, 8 sessions", http_8),
            figure("HTTP calls/s, 32 sessions", http_32),
        ],
        "targets": [
            target("stdio p50: Bastion / direct", p50, "<= 1.5x", p50 <= 1.5),
            target("stdio p50: Bastion / direct, the next step", p50, "<= 1.3x", p50 <= 1.3),
            target("HTTP, 8 sessions: Bastion / direct", http_8, ">= 0.6x", http_8 >= 0.6),
            target("HTTP, 32 sessions: Bastion / direct", http_32, ">= 0.6x", http_32 >= 0.6),
        ],
    }


OLDER = summary("20261126T120233Z", "a", 3.72, 0.441, 0.55, suffix=" (a note older summaries carried)")
NEWER = summary("20261127T184254Z", "b", 1.826, 0.61, 0.645)


def test_extract_reads_the_three_ratios_and_their_targets_whatever_note_follows_a_target_name() -> None:
    run = extract(OLDER)

    assert (run.run, run.date, run.commit) == ("20261126T120233Z", "2026-11-26 12:03", "aaaaaaa")
    assert [reading.value for reading in run.readings] == [3.72, 0.441, 0.55]
    assert [reading.wanted for reading in run.readings] == [("<= 1.5x", "<= 1.3x"), (">= 0.6x",), (">= 0.6x",)]
    assert [reading.met for reading in extract(NEWER).readings] == [False, True, True]


def test_a_summary_without_a_headline_figure_is_skipped_and_named() -> None:
    lacking = summary("20261126T130806Z", "c", 2.1, 0.52, 0.48)
    lacking["figures"].pop(1)

    with pytest.raises(MissingFigure):
        extract(lacking)
    runs, notes = runs_of([("c" * 40, lacking), ("a" * 40, OLDER), ("b" * 40, NEWER), ("d" * 40, NEWER)])
    assert [run.commit for run in runs] == ["aaaaaaa", "bbbbbbb"]
    assert [note.split()[0] for note in notes] == ["ccccccc", "ddddddd"]


def test_the_section_holds_a_row_per_run_and_a_chart_per_ratio_with_its_target() -> None:
    runs, _ = runs_of([("a" * 40, OLDER), ("b" * 40, NEWER)])
    body = section(runs, [])

    assert "| 2026-11-26 12:03 | bbbbbbb | 1.826x missed | 0.610x met | 0.645x met |" in body
    assert body.count("```mermaid\nxychart-beta") == 3
    assert '    x-axis ["aaaaaaa", "bbbbbbb"]' in body
    assert "    line [3.72, 1.826]\n    line [1.5, 1.5]" in body
    assert "    line [0.441, 0.61]\n    line [0.6, 0.6]" in body


def test_rewrite_replaces_only_what_lies_between_the_markers_and_again_to_the_same_text() -> None:
    readme = f"# Performance\n\n{START}\nstale\n{END}\n\nafter\n"

    once = rewrite(readme, "fresh")
    assert once == f"# Performance\n\n{START}\nfresh\n{END}\n\nafter\n"
    assert rewrite(once, "fresh") == once
