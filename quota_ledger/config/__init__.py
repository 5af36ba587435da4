"""YuniKorn's queue configuration: parse, normalize, validate. Pure; no I/O but reading a file.

``load`` turns YAML (text, a file path) or a mapping into a frozen :class:`SchedulerConfig`,
``validate`` lists every reason YuniKorn would refuse it, ``dump`` gives it back as plain data.
Configured quantities follow YuniKorn's rules (:func:`parse_config_quantity`), not Kubernetes'.
"""

from __future__ import annotations

from quota_ledger.config.amounts import parse_config_quantity, parse_config_resources
from quota_ledger.config.model import SchedulerConfig, dump, load
from quota_ledger.config.validate import validate

__all__ = [
    "SchedulerConfig",
    "dump",
    "load",
    "parse_config_quantity",
    "parse_config_resources",
    "validate",
]
