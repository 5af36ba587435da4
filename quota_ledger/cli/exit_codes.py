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

#: what each code means, as a command's ``--help`` lists it
MEANINGS: dict[int, str] = {
    0: "ok",
    EXIT_ERROR: "error: the message is on standard error (JSON with --json)",
    EXIT_USAGE: "bad usage: an unknown command or option, a missing argument, an unreadable token file",
    EXIT_OVER_QUOTA: "over quota: the request would take a queue, user or group over its limit",
    EXIT_DRIFT: "drift: counters disagree with the ledger history (without --fix)",
}
#: the codes every command may return
MEANINGS_SHARED: dict[int, str] = {code: MEANINGS[code] for code in (0, EXIT_ERROR, EXIT_USAGE)}
