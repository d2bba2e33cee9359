"""stlib.bench.program_size_probe: the probes are named and refused by name, the committed records
name probes of the list, and the table keeps the list's order (the rows' estimates are compiled in
notebook 08, from the seed of the estimate cache)."""

from __future__ import annotations

import pytest

from stlib import paths
from stlib.bench import program_size_probe as probe


def test_probes_are_chosen_by_label_and_an_unknown_label_is_refused():
    assert probe.probes() == list(probe.PROBES)
    (one,) = probe.probes(["band 2048x2048, no patterns"])
    assert one.call_options("v5e") == {"block_kv_compute": 256, "chip": "v5e", "pattern_grain": 0}
    with pytest.raises(ValueError, match="unknown probes \\['band 4096'\\]"):
        probe.probes(["band 4096"])


def test_the_committed_records_are_probes_of_the_list_measured_on_a_tpu():
    records = probe.read(paths.REPO / probe.RECORDS)
    labels = {p.label for p in probe.PROBES}
    assert records and {label for _, label in records} <= labels
    assert all(r["backend"] == "tpu" and not r["interpret"] and r["median_ms"] > 0 for r in records.values())


def test_the_table_keeps_the_probes_order_and_says_each_ratio():
    row = lambda label, ms: {"chip": "v5e", "probe": label, "measured_ms": ms, "bundles_only_ms": 50.0,
                             "program_bundles": 70_000, "ratio": ms / 50.0}  # fmt: skip
    first, last = probe.PROBES[0].label, probe.PROBES[-1].label
    lines = probe.format_rows([row(last, 50.0), row(first, 140.0)]).splitlines()
    assert lines[1].startswith(f"v5e   {first}") and lines[1].endswith("2.80")
    assert lines[2].startswith(f"v5e   {last}") and "70,000" in lines[2]
