"""``python -m quota_ledger.cli``: the same as the ``quota-ledger`` command."""

from __future__ import annotations

import sys

from quota_ledger.cli.app import console_main

sys.exit(console_main())
