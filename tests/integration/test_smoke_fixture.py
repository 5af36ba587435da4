from quota_ledger import QuotaEngine


def test_fresh_database_is_empty_and_usable(ledger: QuotaEngine) -> None:
    assert ledger.usage("root") == {}
    ledger.set_limits("root.a", {"fpga": 1})
    assert ledger.usage("root.a")["fpga"].limit == 1
