"""What running the ledger as a program needs, shared by the entry points (the CLI, the HTTP
service, the reconciler): settings, where the database is, the expiry loop, the tokens and the
read-only overview."""
