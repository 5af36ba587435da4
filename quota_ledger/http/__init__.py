"""The HTTP service: FastAPI routes over a :class:`~quota_ledger.QuotaEngine`.

``create_app(engine, settings)`` builds the application; ``quota-ledger serve`` runs it on
uvicorn with the expiry sweeper in the background.
"""
