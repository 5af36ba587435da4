"""OpenStack: limits from Keystone's unified limits, kept as the ledger's queue configuration.

:mod:`.limits` turns what Keystone says (its enforcement model, registered limits, project and
domain limits, projects) into queues of the ledger's configuration, and is pure. Reading
Keystone (:mod:`.keystone`) and keeping the ledger in step with it (:mod:`.sync`) need the
``openstack`` extra (``pip install quota-ledger[openstack]``).
"""
