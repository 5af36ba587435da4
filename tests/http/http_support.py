"""Helpers shared by the HTTP tests."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from quota_ledger import QuotaEngine


@dataclass
class Service:
    base: str
    engine: QuotaEngine
    tokens: dict[str, str]

    def client(self, role: str | None = "admin", **headers: str) -> httpx.Client:
        if role is not None:
            headers.setdefault("Authorization", f"Bearer {self.tokens[role]}")
        return httpx.Client(base_url=self.base, headers=headers, timeout=30)
