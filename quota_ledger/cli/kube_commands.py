"""The Kubernetes commands: ``namespace apply``, ``quota apply|delete|status``, ``admission
apply`` and ``pod reserve|release``, each reading its manifest from a FILE (``-`` for stdin)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from quota_ledger.cli import output
from quota_ledger.cli.arguments import read_source
from quota_ledger.engine import QuotaEngine
from quota_ledger.service.settings import Settings

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands


def register(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``namespace``, ``quota``, ``admission`` and ``pod`` with their actions."""
    shared = [options.common, options.partition]
    namespace = sub.add_parser("namespace", help="Kubernetes namespaces on queues").add_subparsers(
        title="namespace commands", metavar="ACTION"
    )
    p = namespace.add_parser("apply", parents=shared, help="place a Namespace manifest FILE")
    p.add_argument("file")
    p.set_defaults(handler=_namespace_apply)
    quota = sub.add_parser("quota", help="Kubernetes ResourceQuotas").add_subparsers(
        title="quota commands", metavar="ACTION"
    )
    p = quota.add_parser("apply", parents=shared, help="create or replace a ResourceQuota from FILE")
    p.add_argument("file")
    p.set_defaults(handler=_quota_apply)
    for action, handler, text in (
        ("delete", _quota_delete, "delete NAMESPACE NAME"),
        ("status", _quota_status, "hard and used of NAMESPACE NAME"),
    ):
        p = quota.add_parser(action, parents=shared, help=text)
        p.add_argument("namespace")
        p.add_argument("name")
        p.set_defaults(handler=handler)
    admission = sub.add_parser("admission", help="ResourceQuota admission configuration").add_subparsers(
        title="admission commands", metavar="ACTION"
    )
    p = admission.add_parser("apply", parents=shared, help="set it from FILE")
    p.add_argument("file")
    p.set_defaults(handler=_admission_apply)
    pod = sub.add_parser("pod", help="Kubernetes Pods as reservations").add_subparsers(
        title="pod commands", metavar="ACTION"
    )
    p = pod.add_parser("reserve", parents=shared, help="reserve what the Pod in FILE needs")
    p.add_argument("file")
    p.add_argument("--ttl", type=float)
    p.add_argument("--key", help="default: the pod's metadata.uid")
    p.set_defaults(handler=_pod_reserve)
    p = pod.add_parser("release", parents=shared, help="release the Pod in FILE (it is gone)")
    p.add_argument("file")
    p.add_argument("--key")
    p.add_argument("--finished", action="store_true")
    p.set_defaults(handler=_pod_release)


def _namespace_apply(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    queue = engine.apply_namespace(read_source(args.file), partition=args.partition)
    output.say(args, {"queue": queue}, "namespace placed on {queue}")
    return 0


def _quota_apply(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    output.emit(engine.apply_resource_quota(read_source(args.file), partition=args.partition))
    return 0


def _quota_delete(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    engine.delete_resource_quota(args.namespace, args.name, partition=args.partition)
    output.say(args, {"quota": f"{args.namespace}/{args.name}"}, "deleted resourcequota {quota}")
    return 0


def _quota_status(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    output.emit(engine.resource_quota_status(args.namespace, args.name, partition=args.partition))
    return 0


def _admission_apply(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    engine.apply_admission_config(read_source(args.file), partition=args.partition)
    output.say(args, {"file": args.file}, "admission configuration applied from {file}")
    return 0


def _pod_reserve(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    made = engine.reserve_pod(read_source(args.file), partition=args.partition, ttl=args.ttl, key=args.key)
    return output.reservation(args, made)


def _pod_release(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    done = engine.release_pod(
        read_source(args.file), partition=args.partition, key=args.key, finished=args.finished
    )
    return output.reservation(args, done)
