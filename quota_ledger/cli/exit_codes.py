"""The ``quota-ledger`` command's exit codes, beyond 0 for success."""

from __future__ import annotations

#: a ledger error (the message is on standard error), or a configuration with problems
EXIT_ERROR = 1
#: bad usage: an unknown command or option, or a command that needs the database given --url
EXIT_USAGE = 2
#: the request would take a queue, user or group over its limit
EXIT_OVER_QUOTA = 3
#: ``audit`` found counters that disagree with the ledger history (without ``--fix``)
EXIT_DRIFT = 4
