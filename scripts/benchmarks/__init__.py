"""The benchmark behind ``scripts/bench``: quota_ledger on PostgreSQL, library vs raw psycopg
vs pgbench, the expiry sweep under load, and side-by-side cases.

``settings`` reads the command line; ``harness`` times worker threads and runs side-by-side
rounds; ``database`` makes the throw-away databases; ``workload`` is the ledger every case
measures; ``replica`` and ``pgbench`` are the two reference implementations; ``cases`` holds
one module per case; ``report`` prints the tables and writes the JSON; ``run`` calls them in
order.
"""
