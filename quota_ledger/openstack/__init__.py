"""OpenStack: limits from Keystone's unified limits, kept as the ledger's queue configuration.

:mod:`.limits` turns what Keystone says (its enforcement model, registered limits, project and
domain limits, projects) into queues of the ledger's configuration, and is pure. Reading
Keystone (:mod:`.keystone`) and keeping the ledger in step with it (:mod:`.sync`) need the
``openstack`` extra (``pip install quota-ledger[openstack]``), as does :class:`Enforcer`
(:mod:`.enforcer`), a drop-in for oslo.limit's with the ledger counting and :meth:`Enforcer.claim`
reserving atomically.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quota_ledger.openstack.claims import Claim
    from quota_ledger.openstack.enforcer import Enforcer

# Imported when first asked for: the enforcer needs oslo.limit (the openstack extra), the
# mapping in limits does not.
_HOMES = {"Claim": "quota_ledger.openstack.claims", "Enforcer": "quota_ledger.openstack.enforcer"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib

        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Claim", "Enforcer"]
