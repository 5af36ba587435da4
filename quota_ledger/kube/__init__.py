"""Kubernetes on the ledger: pods as reservations, ResourceQuota scopes, covering-quota admission.

Pure: parsing, validation and matching. The engine stores the objects and charges the counters.
"""
