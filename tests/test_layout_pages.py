"""``python -m benchmarks.layout_pages``: the layouts' WAL pages as the tool counts them, on bare
SQLite (real WAL frames, read back by ``benchmarks.wal_pages``), rows sized like the gate's."""

from __future__ import annotations

from pathlib import Path

from benchmarks.layout_pages import LAYOUTS, pages

ROWS = {
    "PROPOSED": (b"p" * 724, None),
    "AUTHORIZED": (b"a" * 721, None),
    "DISPATCHED": (b"d" * 537, '{"approved":{"amount_cents":2000}}'),
    "COMMITTED": (b"c" * 484, '{"result":{"id":"re_1"}}'),
}


def test_the_commit_as_a_pure_append_writes_fewer_pages(tmp_path: Path) -> None:
    found = {layout: pages(layout, ROWS, tmp_path / f"{layout}.db", 300, 200) for layout in LAYOUTS}
    now, append, v3 = (found[layout] for layout in LAYOUTS)
    # schema 13's shape: the row's update and the in-doubt index's delete at every commit
    assert now[1]["effects_in_doubt"] >= 1.5 and now[1]["effects"] > append[1]["effects"]
    assert "effects_in_doubt" not in append[1] and append[1]["entries_dispatched"] < 1.5
    # fewer pages with each step; one combined entry leaves one link in entries_next per effect
    assert now[0] > append[0] > v3[0]
    assert v3[1]["entries_next"] < append[1]["entries_next"]
