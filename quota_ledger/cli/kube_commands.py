"""The Kubernetes commands: ``namespace apply``, ``quota apply|delete|status``, ``admission
apply`` and ``pod reserve|release``, each reading its manifest from a FILE (``-`` for stdin)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from quota_ledger.cli import help_text, output
from quota_ledger.cli.arguments import read_source
from quota_ledger.cli.exit_codes import EXIT_OVER_QUOTA, MEANINGS

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands
    from quota_ledger.engine import QuotaEngine
    from quota_ledger.service.settings import Settings


def _manifest(kind: str) -> str:
    return f"a {kind} manifest, YAML or JSON; - reads standard input"


def register(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``namespace``, ``quota``, ``admission`` and ``pod`` with their actions."""
    shared = [options.common, options.partition]
    namespace = help_text.add_group(sub, "namespace", help="Kubernetes namespaces on queues")
    p = help_text.add_command(
        namespace,
        "apply",
        parents=shared,
        help="place a Namespace manifest FILE",
        description="Place a Namespace on its queue, root.NAME or under the yunikorn.apache.org/parentqueue "
        "annotation, with the queue's max from its namespace.quota annotation; prints the queue.",
        examples=[
            "quota-ledger namespace apply examples/kubernetes/namespace.yaml",
            "kubectl get namespace analytics -o yaml | quota-ledger namespace apply -",
        ],
    )
    p.add_argument("file", help=_manifest("Namespace"))
    p.set_defaults(handler=_namespace_apply)
    quota = help_text.add_group(sub, "quota", help="Kubernetes ResourceQuotas")
    p = help_text.add_command(
        quota,
        "apply",
        parents=shared,
        help="create or replace a ResourceQuota from FILE",
        description="Create or replace a ResourceQuota; prints its status (hard and used) as JSON.",
        examples=[
            "quota-ledger quota apply examples/kubernetes/quota.yaml",
            "kubectl get resourcequota compute -n analytics -o yaml | quota-ledger quota apply -",
        ],
    )
    p.add_argument("file", help=_manifest("ResourceQuota"))
    p.set_defaults(handler=_quota_apply)
    for action, handler, text, description in (
        ("delete", _quota_delete, "delete NAMESPACE NAME", "Delete a ResourceQuota."),
        (
            "status",
            _quota_status,
            "hard and used of NAMESPACE NAME",
            "Print a ResourceQuota's hard and used, as JSON.",
        ),
    ):
        p = help_text.add_command(
            quota,
            action,
            parents=shared,
            help=text,
            description=description,
            examples=[
                f"quota-ledger quota {action} analytics compute",
                f"quota-ledger quota {action} analytics gpus --partition gpu",
            ],
        )
        p.add_argument("namespace", help="the ResourceQuota's namespace")
        p.add_argument("name", help="the ResourceQuota's name")
        p.set_defaults(handler=handler)
    admission = help_text.add_group(sub, "admission", help="ResourceQuota admission configuration")
    p = help_text.add_command(
        admission,
        "apply",
        parents=shared,
        help="set it from FILE",
        description="Set the ResourceQuota admission configuration (which scopes need a covering quota).",
        examples=[
            "quota-ledger admission apply examples/kubernetes/admission.yaml",
            "quota-ledger admission apply - < admission-config.json",
        ],
    )
    p.add_argument("file", help=_manifest("AdmissionConfiguration"))
    p.set_defaults(handler=_admission_apply)
    pod = help_text.add_group(sub, "pod", help="Kubernetes Pods as reservations")
    over = {EXIT_OVER_QUOTA: MEANINGS[EXIT_OVER_QUOTA]}
    p = help_text.add_command(
        pod,
        "reserve",
        parents=shared,
        help="reserve what the Pod in FILE needs",
        description="Reserve what a Pod requests, in the queue its labels or its namespace place it in, for "
        "the user of its yunikorn.apache.org/user.info annotation; prints the reservation.",
        examples=[
            "quota-ledger pod reserve examples/kubernetes/pod.yaml",
            "kubectl get pod report-1 -n analytics -o yaml | quota-ledger pod reserve - --ttl 120",
        ],
        exits=over,
    )
    p.add_argument("file", help=_manifest("Pod"))
    p.add_argument("--ttl", type=float, metavar="S", help="seconds until the reservation expires")
    p.add_argument("--key", metavar="K", help="idempotency key (default: the pod's metadata.uid)")
    p.set_defaults(handler=_pod_reserve)
    p = help_text.add_command(
        pod,
        "release",
        parents=shared,
        help="release the Pod in FILE (it is gone)",
        description="Release what a Pod holds (found by its key): it is gone.",
        examples=[
            "quota-ledger pod release examples/kubernetes/pod.yaml",
            "kubectl get pod report-1 -n analytics -o yaml | quota-ledger pod release - --finished",
        ],
    )
    p.add_argument("file", help=_manifest("Pod"))
    p.add_argument(
        "--key", metavar="K", help="the key it was reserved with (default: the pod's metadata.uid)"
    )
    p.add_argument("--finished", action="store_true", help="its application has finished")
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
