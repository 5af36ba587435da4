"""The Kubernetes commands: ``namespace apply``, ``quota apply|delete|status``, ``admission
apply`` and ``pod reserve|release``, each reading its manifest from a FILE (``-`` for stdin);
and ``kube webhook-config``, which prints the webhook registration of an install in a cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from quota_ledger.cli import help_text, output, reconcile_command
from quota_ledger.cli.arguments import read_source
from quota_ledger.cli.exit_codes import EXIT_OVER_QUOTA, EXIT_USAGE, MEANINGS

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands
    from quota_ledger.engine import QuotaEngine
    from quota_ledger.runtime.settings import Settings


def _manifest(kind: str) -> str:
    return f"a {kind} manifest, YAML or JSON; - reads standard input"


def register(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``namespace``, ``quota``, ``admission``, ``pod`` and ``kube`` with their actions."""
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
    _register_kube(sub, options)


def _register_kube(sub: Subcommands, options: SharedOptions) -> None:
    kube = help_text.add_group(sub, "kube", help="running the ledger in a Kubernetes cluster")
    p = help_text.add_command(
        kube,
        "webhook-config",
        parents=[options.common],
        help="print the ValidatingWebhookConfiguration of an install",
        description="Print the registration of the admission webhook (POST /v1/admission/pods) for the "
        "Service NAME in namespace NS, as YAML (JSON with --json): the document of "
        "deploy/kubernetes/webhook/validating-webhook.yaml with the service, the namespace and the CA "
        "bundle filled in. Pods in kube-system and in NS are left out. Needs no database.",
        examples=[
            "quota-ledger kube webhook-config --service ql --namespace ql --ca-bundle ca.pem > hook.yaml",
            "quota-ledger kube webhook-config --service ql --namespace ql --ca-bundle ca.pem --json",
        ],
        exits={
            EXIT_USAGE: "bad usage: a missing option, a name that is not a DNS label, a CA bundle "
            "that cannot be read or holds no certificate"
        },
    )
    p.add_argument("--service", required=True, metavar="NAME", help="the Service in front of the ledger")
    p.add_argument("--namespace", required=True, metavar="NS", help="its namespace, left out of the webhook")
    p.add_argument(
        "--ca-bundle",
        required=True,
        metavar="FILE",
        help="PEM CA certificate(s) the API server checks the service's certificate against",
    )
    p.add_argument(
        "--failure-policy",
        choices=["Fail", "Ignore"],
        default="Fail",
        help="when the ledger cannot answer: refuse the pod (Fail, the default) or admit it uncounted",
    )
    p.add_argument(
        "--timeout-seconds",
        type=int,
        default=5,
        metavar="S",
        help="seconds the API server waits for an answer, 1 to 30 (default: 5)",
    )
    p.add_argument(
        "--path",
        default="/v1/admission/pods",
        metavar="PATH",
        help="the endpoint's path on the service (default: /v1/admission/pods)",
    )
    p.add_argument("--name", metavar="NAME", help="the configuration's name (default: the service's)")
    p.set_defaults(handler=_webhook_config, standalone=True)
    reconcile_command.register(kube, options)


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


def _webhook_config(args: argparse.Namespace) -> int:
    import json

    import yaml

    from quota_ledger.kube import webhook
    from quota_ledger.model.errors import InvalidRequest

    try:
        ca_bundle = Path(args.ca_bundle).read_bytes()
    except OSError as error:
        print(f"error: cannot read the CA bundle {args.ca_bundle}: {error.strerror}", file=sys.stderr)
        return EXIT_USAGE
    install = webhook.WebhookInstall(
        service=args.service,
        namespace=args.namespace,
        ca_bundle=ca_bundle,
        name=args.name,
        failure_policy=args.failure_policy,
        timeout_seconds=args.timeout_seconds,
        path=args.path,
    )
    try:
        document = webhook.configuration(install)
    except InvalidRequest as error:
        output.fail(args, error)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(yaml.safe_dump(document, sort_keys=False), end="")
    return 0
