"""``quota-ledger openstack sync``: Keystone's unified limits as the ledger's queues, once or
every N seconds. Needs the ``openstack`` extra; the OpenStack libraries load only when it runs."""

from __future__ import annotations

import argparse
import logging
import threading
from typing import TYPE_CHECKING

from quota_ledger.cli import arguments, help_text, output

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands
    from quota_ledger.engine import QuotaEngine
    from quota_ledger.openstack.sync import SyncResult
    from quota_ledger.runtime.settings import Settings


def register(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``openstack sync``."""
    group = help_text.add_group(sub, "openstack", help="limits from OpenStack Keystone's unified limits")
    p = help_text.add_command(
        group,
        "sync",
        parents=[options.common, options.partition],
        help="apply Keystone's unified limits as the ledger's queues",
        description="Read Keystone's enforcement model, registered limits, project and domain limits "
        "and projects, and apply them as the queues root.PROJECT (flat) or root.DOMAIN.PROJECT "
        "(strict_two_level), one configuration change; no new version when nothing changed. The "
        "credentials come from clouds.yaml (--cloud, else OS_CLOUD) or the OS_* variables, as the "
        "openstack command reads them; they never appear in the output.\n\n"
        "With --every the sync runs until interrupted; a sync that cannot read Keystone is "
        "reported and the limits in force stay. Needs pip install 'quota-ledger[openstack]'.",
        examples=[
            "quota-ledger openstack sync --cloud mycloud",
            "quota-ledger openstack sync --service compute --region RegionOne --every 60",
            "quota-ledger openstack sync --missing-registered unlimited --json  # cloud: OS_CLOUD or OS_*",
        ],
        exits={1: "error: Keystone could not be read or its limits not applied (the message says which)"},
    )
    p.add_argument("--cloud", metavar="NAME", help="the clouds.yaml cloud (default: OS_CLOUD, else OS_*)")
    p.add_argument(
        "--every",
        type=arguments.seconds,
        metavar="SECONDS",
        help="sync again every SECONDS until interrupted (default: once)",
    )
    p.add_argument(
        "--service",
        action="append",
        default=[],
        metavar="S",
        help="take the limits of this service only: its id, name or type (repeatable; default: all)",
    )
    p.add_argument(
        "--region",
        metavar="R",
        help="take this region's limits with those of no region (default: those of no region)",
    )
    p.add_argument(
        "--missing-registered",
        choices=["zero", "unlimited"],
        default="zero",
        help="a resource with no registered limit, for a project without its own: "
        "zero refuses it, as oslo.limit does (default); unlimited sets no max",
    )
    p.set_defaults(handler=_sync, local_only=True)


def _sync(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    from quota_ledger.model.errors import QuotaLedgerError
    from quota_ledger.openstack import keystone, sync
    from quota_ledger.openstack.unified_limits import MissingRegistered

    if not args.verbose:  # its discovery warnings repeat what the error says
        logging.getLogger("keystoneauth").setLevel(logging.ERROR)
    reader = keystone.KeystoneReader(keystone.session_for(args.cloud))
    options = sync.SyncOptions(
        services=tuple(args.service),
        region=args.region,
        missing=MissingRegistered(args.missing_registered),
        partition=args.partition,
    )
    syncer = sync.KeystoneSync(engine, reader, options)
    if args.every is None:
        _report(args, syncer.sync_once())
        return 0
    stop = threading.Event()
    try:
        while not stop.is_set():
            try:
                _report(args, syncer.sync_once())
            except QuotaLedgerError as error:
                output.fail(args, error)
            stop.wait(args.every)
    except KeyboardInterrupt:
        pass
    return 0


def _report(args: argparse.Namespace, result: SyncResult) -> None:
    data = {
        "version": result.version,
        "changed": result.changed,
        "projects": result.projects,
        "queues": list(result.queues),
        "at": result.at.isoformat(),
    }
    if result.changed:
        template = "synced {projects} projects from Keystone: configuration version {version}"
    else:
        template = "synced {projects} projects from Keystone: unchanged, version {version} stays in force"
    output.say(args, data, template)
