"""``quota-ledger kube reconcile``: the reconciler, until interrupted. Needs the ``kubernetes``
extra; the client loads only when the command runs. Each option overrides its
``QUOTA_LEDGER_RECONCILE_*`` setting."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
from typing import TYPE_CHECKING, Any

from quota_ledger.cli import arguments, help_text

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands
    from quota_ledger.engine import QuotaEngine
    from quota_ledger.runtime.settings import Settings

#: where the Lease lives when neither --lease-namespace nor $POD_NAMESPACE says
DEFAULT_NAMESPACE = "quota-ledger"


def register(kube: Subcommands, options: SharedOptions) -> None:
    """Add ``reconcile`` to the ``kube`` group."""
    p = help_text.add_command(
        kube,
        "reconcile",
        parents=[options.common, options.partition],
        help="keep the ledger in line with a cluster's pods, namespaces and ResourceQuotas",
        description="List and watch the cluster's pods, namespaces and ResourceQuotas and bring the "
        "ledger in line: commit the reservation of a pod seen stored (the webhook's), charge a pod "
        "the ledger does not know (over a limit if need be: an overrun, logged and counted), release "
        "what a deleted or ended pod holds; place namespaces on their queues and mirror "
        "ResourceQuotas. A full relist runs every --relist-every seconds and after 410 Gone.\n\n"
        "Replicas elect a leader on a coordination.k8s.io Lease; only the leader acts. The cluster "
        "comes from the pod's service account in a cluster, else from --kubeconfig or ~/.kube/config. "
        "Runs until interrupted. Needs pip install 'quota-ledger[kubernetes]'.",
        examples=[
            "quota-ledger kube reconcile  # in a pod: its service account, Lease in $POD_NAMESPACE",
            "quota-ledger kube reconcile --kubeconfig ~/.kube/config --no-leader-election",
            "quota-ledger kube reconcile --write-status --metrics-port 9090 --relist-every 120",
        ],
    )
    p.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig outside a cluster (default: ~/.kube/config)"
    )
    p.add_argument("--context", metavar="NAME", help="the kubeconfig's context (default: its current one)")
    p.add_argument(
        "--relist-every",
        type=arguments.seconds,
        metavar="SECONDS",
        help="seconds between full relists (default: 300, QUOTA_LEDGER_RECONCILE_RELIST_EVERY)",
    )
    p.add_argument(
        "--pending-grace",
        type=arguments.seconds,
        metavar="SECONDS",
        help="a relist rolls back a pending reservation whose pod it lacks once it is this old (default: 60)",
    )
    p.add_argument(
        "--watch-timeout",
        type=arguments.seconds,
        metavar="SECONDS",
        help="seconds one watch request lasts before it is renewed (default: 300)",
    )
    p.add_argument(
        "--write-status",
        action="store_true",
        default=None,
        help="write the ledger's hard and used into each ResourceQuota's status",
    )
    p.add_argument(
        "--status-every",
        type=arguments.seconds,
        metavar="SECONDS",
        help="seconds between status writes, with --write-status (default: 10)",
    )
    p.add_argument(
        "--no-leader-election",
        dest="leader_election",
        action="store_false",
        default=None,
        help="act at once, without a Lease: for a single replica only",
    )
    p.add_argument("--lease-name", metavar="NAME", help="the Lease (default: quota-ledger-reconciler)")
    p.add_argument(
        "--lease-namespace",
        metavar="NS",
        help="the Lease's namespace (default: $POD_NAMESPACE, else quota-ledger)",
    )
    p.add_argument(
        "--identity", metavar="NAME", help="this replica in the Lease (default: $POD_NAME, else the host)"
    )
    p.add_argument(
        "--lease-duration",
        type=arguments.seconds,
        metavar="SECONDS",
        help="how long a Lease not renewed holds (default: 15)",
    )
    p.add_argument(
        "--renew-deadline",
        type=arguments.seconds,
        metavar="SECONDS",
        help="how long the leader tries to renew before it stops acting (default: 10)",
    )
    p.add_argument(
        "--retry-period",
        type=arguments.seconds,
        metavar="SECONDS",
        help="seconds between Lease attempts (default: 2)",
    )
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve /metrics on PORT (default: none)")
    p.set_defaults(handler=_reconcile, local_only=True)


def settings_from(args: argparse.Namespace) -> Any:
    """The reconciler's settings: the environment's, overridden by the options given."""
    from quota_ledger.reconciler.settings import ReconcilerSettings

    given = {
        name: getattr(args, name)
        for name in (
            "relist_every",
            "pending_grace",
            "watch_timeout",
            "write_status",
            "status_every",
            "leader_election",
            "lease_name",
            "lease_namespace",
            "identity",
            "lease_duration",
            "renew_deadline",
            "retry_period",
            "metrics_port",
        )
        if getattr(args, name, None) is not None
    }
    return ReconcilerSettings(**given)


def _reconcile(engine: QuotaEngine, args: argparse.Namespace, _settings: Settings) -> int:
    from quota_ledger.model.errors import InvalidRequest

    try:
        from kubernetes import client, config
    except ImportError as error:
        raise InvalidRequest(
            "the reconciler needs the kubernetes client: pip install 'quota-ledger[kubernetes]'",
            field="kubernetes",
        ) from error

    from quota_ledger.reconciler.leader import LeaseConfig
    from quota_ledger.reconciler.run import Reconciler

    settings = settings_from(args)
    if os.environ.get("KUBERNETES_SERVICE_HOST") and args.kubeconfig is None:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(config_file=args.kubeconfig, context=args.context)  # type: ignore[no-untyped-call]
    lease = None
    if settings.leader_election:
        lease = LeaseConfig(
            name=settings.lease_name,
            namespace=settings.lease_namespace or os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE,
            identity=settings.identity or os.environ.get("POD_NAME") or socket.gethostname(),
            lease_duration=settings.lease_duration,
            renew_deadline=settings.renew_deadline,
            retry_period=settings.retry_period,
        )
    reconciler = Reconciler(engine, client.ApiClient(), settings, lease=lease, partition=args.partition)
    if settings.metrics_port is not None:
        reconciler.metrics.serve(settings.metrics_port, settings.metrics_host)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    reconciler.run(stop)
    return 0
