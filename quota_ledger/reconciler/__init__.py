"""The reconciler (``quota-ledger kube reconcile``): it lists and watches a cluster's pods,
namespaces and ResourceQuotas through the ``kubernetes`` client and brings the ledger in line.

- :mod:`~quota_ledger.reconciler.decision`: what one pod event means for the ledger (pure);
- :mod:`~quota_ledger.reconciler.relist`: a full list against what the ledger holds (pure);
- :mod:`~quota_ledger.reconciler.listwatch`: the list/watch loop of one kind;
- :mod:`~quota_ledger.reconciler.pods`, :mod:`~quota_ledger.reconciler.objects`: the ledger's
  side of pods, and of namespaces and ResourceQuotas;
- :mod:`~quota_ledger.reconciler.leader`: leader election on a coordination.k8s.io Lease;
- :mod:`~quota_ledger.reconciler.metrics`, :mod:`~quota_ledger.reconciler.settings`,
  :mod:`~quota_ledger.reconciler.run` (the whole, as the command runs it).
"""
