"""CommLedger bookkeeping (no ranks needed)."""

import pytest

from lesson_code.collectives.ledger import CommLedger, TrafficCounter


def test_totals_group_entries_by_operation():
    ledger = CommLedger()
    ledger.record("all_reduce", 100, 100, 2, 2)
    ledger.record("all_reduce", 50, 40, 1, 1)
    ledger.record("broadcast", 10, 0, 1, 0)
    totals = ledger.totals()
    assert totals["all_reduce"] == {"calls": 2, "bytes_sent": 150, "bytes_received": 140,
                                    "messages_sent": 3, "messages_received": 3}
    assert ledger.bytes_sent == 160 and ledger.bytes_received == 140
    ledger.clear()
    assert ledger.totals() == {}


def test_negative_counts_are_a_bug():
    with pytest.raises(ValueError, match="non-negative"):
        CommLedger().record("all_reduce", -1, 0, 0, 0)


def test_counter_commits_one_entry_and_works_without_a_ledger():
    ledger = CommLedger()
    counter = TrafficCounter("all_gather", ledger)
    counter.sent(8)
    counter.sent(8)
    counter.received(16)
    counter.commit()
    assert ledger.entries[0].bytes_sent == 16 and ledger.entries[0].messages_sent == 2
    TrafficCounter("all_gather", None).commit()  # no ledger: nothing to do, no error
