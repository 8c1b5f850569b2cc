"""What lets a soak run with a short retention, and what it reports of the tables' sizes: clients
never ask again for a key whose record may be purged, and the summary's size lines. Run with
``pytest scripts/soaklib`` (``make test-soak``)."""

from __future__ import annotations

import random
from unittest import mock

from soaklib import client
from soaklib.summary import table_sizes


def test_with_a_retention_old_keys_are_asked_only_within_half_of_it() -> None:
    rng = random.Random(7)
    started = 1_000.0
    retention = 60.0
    oldest_allowed = None
    for now in (started + 300.0, started + 301.5, started + 900.0):
        window = int((now - started) / client.WINDOW_SECONDS)
        oldest_allowed = (window - int(retention / 2 / client.WINDOW_SECONDS)) * client.KEYS_PER_WINDOW
        with mock.patch.object(client.time, "time", return_value=now):
            keys = [client.pick_key(rng, started, retention) for _ in range(5_000)]
        assert min(keys) >= oldest_allowed
        assert max(keys) < (window + 2) * client.KEYS_PER_WINDOW
        assert any(k < window * client.KEYS_PER_WINDOW for k in keys)  # old keys are still asked


def test_without_a_retention_any_old_key_may_be_asked() -> None:
    rng = random.Random(7)
    with mock.patch.object(client.time, "time", return_value=1_900.0):
        keys = [client.pick_key(rng, 1_000.0) for _ in range(5_000)]
    assert min(keys) < 10 * client.KEYS_PER_WINDOW


def test_table_sizes_show_the_first_the_quarters_the_last_and_the_largest() -> None:
    events = [{"t": "table_sizes", "time": 100.0 + 10 * i,
               "sizes": {"public.records": (100 + i) * 1024, "public.receipts": 8192}} for i in range(9)]
    events.append({"t": "op"})
    lines = table_sizes(events)
    assert lines[0].startswith("table sizes (pg_total_relation_size, KiB) at 0s, 20s, 40s, 60s, 80s of 9 samples")
    records = next(line for line in lines if "public.records" in line)
    assert records.split()[1:6] == ["100", "102", "104", "106", "108"]
    assert records.endswith("max 108")
    assert table_sizes([{"t": "op"}]) == []
