"""The benchmark's cases, one module each.

``throughput`` and ``sweep`` run on the main database (library vs psycopg vs pgbench cells,
then the expiry sweep under load); ``hierarchy``, ``kube`` and ``http`` each run two variants
side by side on a database of their own. A case measures and returns a JSON-ready dict; its
targets are constants in its module, and ``benchmarks.report`` prints it. A run takes the cases
``--cases`` names (``benchmarks.settings.CASES``).
"""
