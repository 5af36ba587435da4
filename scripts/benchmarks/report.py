"""What a run prints: the Markdown tables on stdout (one section per case, ratios against their
targets marked ✓ or ✗) and, with ``--json``, every figure and sample as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from benchmarks.cases import (
    admission,
    cli,
    cold,
    group_commit,
    hierarchy,
    hot,
    http,
    kube,
    set_limits,
    sweep,
    throughput,
    waiting,
)
from benchmarks.cases.throughput import Cell
from benchmarks.harness import log, median
from benchmarks.settings import IMPLEMENTATIONS, Config


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing (an implementation left out by ``--only``)."""
    return a / b if a is not None and b else None


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_ratio(value: float | None, target: float) -> str:
    """The ratio with ✓ when it reaches ``target`` (a floor), ✗ when not."""
    if value is None:
        return "-"
    return f"{value:.2f} {'✓' if value >= target else '✗'}"


def markdown(
    cfg: Config, cells: list[Cell], sweep_result: dict[str, Any] | None, meta: dict[str, Any]
) -> str:
    """The whole report: throughput, the sweep (or the final audit), then each side-by-side case;
    a section for each case the run took."""
    lines = throughput_section(cfg, cells, meta) if cfg.runs("throughput") else []
    if "final_audit" in meta:  # the main database's, after the throughput and sweep cases
        audit = meta["final_audit"]
        audit_text = "clean (0 drifts)" if not audit else f"{len(audit)} DRIFTS (see JSON)"
        audit_text += f", took {meta.get('audit_s', 0.0):.1f} s"
        if sweep_result is not None:
            lines += sweep_section(sweep_result, audit_text)
        else:
            lines += ["", f"audit() at the end: {audit_text}."]
    if meta.get("hierarchy") is not None:
        lines += hierarchy_section(cfg, meta["hierarchy"])
    if meta.get("kube") is not None:
        lines += kube_section(meta["kube"])
    if meta.get("http") is not None:
        lines += http_section(meta["http"])
    if meta.get("admission") is not None:
        lines += admission.section(meta["admission"])
    if meta.get("cold") is not None:
        lines += cold_section(cfg, meta["cold"])
    if meta.get("group_commit") is not None:
        lines += group_commit_section(cfg, meta["group_commit"])
    if meta.get("hot") is not None:
        lines += hot_section(meta["hot"])
    if meta.get("set_limits") is not None:
        lines += set_limits_section(meta["set_limits"])
    if meta.get("cli") is not None:
        lines += cli.section(meta["cli"])
    if meta.get("waiting") is not None:
        lines += waiting.section(meta["waiting"])
    return "\n".join(lines).lstrip("\n")


def throughput_section(cfg: Config, cells: list[Cell], meta: dict[str, Any]) -> list[str]:
    lines = [
        f"### reserve+commit pairs/s ({meta['postgres']}, {meta['cpus']} CPUs, "
        f"{cfg.seconds:g} s per cell{', median of ' + str(cfg.repeat) if cfg.repeat > 1 else ''})",
        "",
        "| scopes | threads | library | psycopg | pgbench "
        f"| library/psycopg (≥ {throughput.TARGET_VS_PSYCOPG}) "
        f"| library/pgbench (≥ {throughput.TARGET_VS_PGBENCH}) |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    names = {"spread": f"spread ({cfg.scopes:,})", "hot": "hot (1)"}
    for cell in cells:
        lib, psy, pgb = (cell.median(impl) for impl in IMPLEMENTATIONS)
        lines.append(
            f"| {names[cell.pattern]} | {cell.threads} | {fmt_rate(lib)} | {fmt_rate(psy)} | {fmt_rate(pgb)} "
            f"| {fmt_ratio(ratio(lib, psy), throughput.TARGET_VS_PSYCOPG)} "
            f"| {fmt_ratio(ratio(lib, pgb), throughput.TARGET_VS_PGBENCH)} |"
        )
    shape = meta.get("shape")
    if shape:
        lines += [
            "",
            f"Transaction shape: {shape['round_trips_per_pair']} round trips per pair (library); "
            f"psycopg replica {'identical' if shape['identical'] else 'DIFFERENT (see JSON)'}.",
        ]
    return lines


def sweep_section(result: dict[str, Any], audit_text: str) -> list[str]:
    finished = result["finished"]
    duration = f"{result['sweep_s']:.2f} s" if finished else f"> {result['sweep_s']:.0f} s (stopped)"
    fast = finished and result["sweep_s"] < sweep.TARGET_SWEEP_SECONDS
    return [
        "",
        f"### expiry sweep: {result['rows']:,} stale reservations, {result['load_threads']} library "
        f"threads reserving+committing meanwhile (median of {len(result['runs'])}); the sweeper runs "
        f"expire(workers={result['workers']}, batch_size={result['batch_size']}"
        + (f", max_rate={result['max_rate']:g})" if result.get("max_rate") else ")"),
        "",
        "| measure | value | target |",
        "|---|--:|--:|",
        f"| expired | {result['expired']:,} | {result['rows']:,} |",
        f"| sweep duration | {duration} | < {sweep.TARGET_SWEEP_SECONDS:g} s {'✓' if fast else '✗'} |",
        f"| sweep rate | {result['rows_per_s']:,.0f} rows/s | |",
        f"| pairs/s without sweep (mean of before and after) | {result['baseline_pairs_per_s']:,.0f} | |",
        f"| pairs/s during sweep | {result['during_pairs_per_s']:,.0f} | |",
        f"| during / without | {fmt_ratio(result['ratio'], sweep.TARGET_SWEEP_RATIO)} "
        f"| ≥ {sweep.TARGET_SWEEP_RATIO} |",
        "| every run: duration, during / without | "
        + ", ".join(f"{run['sweep_s']:.1f} s {run['ratio']:.2f}" for run in result["runs"])
        + " | |",
        f"| audit() after sweep | {audit_text} | clean |",
    ]


def hierarchy_section(cfg: Config, hier: dict[str, Any]) -> list[str]:
    flat, tree = median(hier["flat"]), median(hier["hierarchy"])
    return [
        "",
        f"### hierarchical limits: depth 4, user and group limits at 2 levels, 2 resources, "
        f"{hier['users']:,} users, {hier['threads']} threads (library, side by side)",
        "",
        f"| case | reserve+commit pairs/s | ratio (≥ {hierarchy.TARGET_HIERARCHY}) |",
        "|---|--:|--:|",
        f"| flat ({cfg.scopes:,} queues, no identity) | {fmt_rate(flat)} | |",
        f"| hierarchical (user + group limits) | {fmt_rate(tree)} "
        f"| {fmt_ratio(hier['ratio'], hierarchy.TARGET_HIERARCHY)} |",
        "",
        f"{hier['identity_counters']:,} user/group counters; audit() "
        f"{'clean' if not hier['audit'] else str(len(hier['audit'])) + ' DRIFTS'}.",
    ]


def cold_section(cfg: Config, result: dict[str, Any]) -> list[str]:
    """Each backend and kind: warm and cold pairs/s, cold/warm, and the p99 of both."""
    load = ", ".join(
        f"{a:.2f}/{b:.2f}" for a, b in zip(result["load_before"], result["load_after"], strict=True)
    )
    lines = [
        "",
        f"### first uses: cold (every reservation a first use) vs warm, {cfg.side_threads} threads, "
        f"{cfg.seconds:g} s per window{', median of ' + str(cfg.repeat) if cfg.repeat > 1 else ''}"
        f"{', batching on' if cfg.cold_batching else ''}",
        "",
        f"| backend | first use of | warm pairs/s | cold pairs/s | cold/warm (≥ {cold.TARGET_COLD}) "
        f"| warm p99 ms per call | cold p99 ms per call (< {cold.TARGET_P99_MS:g}) | cold p99 ms per pair |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for backend, found in result["backends"].items():
        for kind, k in found["kinds"].items():
            p99 = k["cold_p99_ms"]
            lines.append(
                f"| {backend} | {kind} | {fmt_rate(k['warm'])} | {fmt_rate(k['cold'])} "
                f"| {fmt_ratio(k['ratio'], cold.TARGET_COLD)} | {k['warm_p99_ms']:.1f} "
                f"| {p99:.1f} {'✓' if p99 < cold.TARGET_P99_MS else '✗'} | {k['cold_pair_p99_ms']:.1f} |"
            )
    audits = [
        f"{b} {'clean' if not r['audit'] else str(len(r['audit'])) + ' DRIFTS'}"
        for b, r in result["backends"].items()
    ]
    lines += ["", f"audit(): {', '.join(audits)}. Load average (1/5/15 min) before/after: {load}."]
    return lines


def kube_section(result: dict[str, Any]) -> list[str]:
    none, five = median(result["none"]), median(result["five"])
    cost = result["cost_ratio"]
    return [
        "",
        f"### pods (reserve_pod + commit): {result['namespaces']} namespaces with 5 scoped ResourceQuotas "
        f"each vs {result['namespaces']} without, {result['threads']} threads, side by side",
        "",
        f"| case | pairs/s | cost vs none (≤ {kube.TARGET_KUBE_COST}) |",
        "|---|--:|--:|",
        f"| namespace without quotas | {fmt_rate(none)} | |",
        f"| namespace with 5 scoped quotas | {fmt_rate(five)} "
        f"| {cost:.2f} {'✓' if cost <= kube.TARGET_KUBE_COST else '✗'} |",
        "",
        f"audit() {'clean' if not result['audit'] else str(len(result['audit'])) + ' DRIFTS'}.",
    ]


def http_section(web: dict[str, Any]) -> list[str]:
    library, served = median(web["library"]), median(web["http"])
    return [
        "",
        f"### HTTP service: reserve+commit through uvicorn ({web['workers']} worker processes), "
        f"{web['threads']} clients, side by side",
        "",
        "| case | pairs/s | target |",
        "|---|--:|--:|",
        f"| library in process | {fmt_rate(library)} | |",
        f"| HTTP (`POST /v1/reservations` + `/commit`) | {fmt_rate(served)} "
        f"| {fmt_ratio(web['ratio'], http.TARGET_HTTP)} x library (≥ {http.TARGET_HTTP}) |",
        f"| latency at 100 requests/s, p50 / p99 | {web['p50_ms']:.1f} / {web['p99_ms']:.1f} ms "
        f"| p99 < {http.TARGET_P99_MS:g} ms {'✓' if web['p99_ms'] < http.TARGET_P99_MS else '✗'} |",
    ]


def hot_section(result: dict[str, Any]) -> list[str]:
    """One row per client count: each column's median pairs/s, then the ratios to pgbench and to
    the library (one transaction per call)."""
    rounds = len(next(iter(result["samples"].values()))["library"])
    load = result["load"]
    lines = [
        "",
        f"### one hot queue: reserve+commit pairs/s, library vs service ({result['workers']} workers, "
        f"batching on) vs pgbench ({result['postgres']}, median of {rounds}, side by side)",
        "",
        "| clients | library | library batching | service | service /v1/batch "
        f"({result['batch_size']} ops) | pgbench | service / pgbench | /v1/batch / pgbench "
        f"(≥ {hot.TARGET_VS_PGBENCH:g}) | service / library (≥ {hot.TARGET_VS_LIBRARY:g} at 16) "
        "| library batching / pgbench |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for clients in result["clients"]:
        found = result["medians"][str(clients)]
        lib, grouped, served, batched, pgb = (found.get(c) for c in hot.COLUMNS)
        vs_library = ratio(served, lib)
        lines.append(
            f"| {clients} | {fmt_rate(lib)} | {fmt_rate(grouped)} | {fmt_rate(served)} | {fmt_rate(batched)} "
            f"| {fmt_rate(pgb)} | {_plain(ratio(served, pgb))} "
            f"| {fmt_ratio(ratio(batched, pgb), hot.TARGET_VS_PGBENCH)} "
            f"| {fmt_ratio(vs_library, hot.TARGET_VS_LIBRARY) if clients == 16 else _plain(vs_library)} "
            f"| {_plain(ratio(grouped, pgb))} |"
        )
    p99 = result["p99_ms"]
    lines += [
        "",
        f"Paced 100 requests/s on the service (batching on): p50 {result['p50_ms']:.1f} ms, "
        f"p99 {p99:.1f} ms (< {hot.TARGET_P99_MS:g} ms {'✓' if p99 < hot.TARGET_P99_MS else '✗'}); "
        f"without batching: p50 {result['plain_p50_ms']:.1f} ms, p99 {result['plain_p99_ms']:.1f} ms. "
        f"Load average {load['start'][0]:.2f} at the start, {load['end'][0]:.2f} at the end "
        f"(1 min); audit() {'clean' if not result['audit'] else str(len(result['audit'])) + ' DRIFTS'}.",
    ]
    return lines


def _plain(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def set_limits_section(result: dict[str, Any]) -> list[str]:
    sizes = result["sizes"]
    medians = {int(size): value for size, value in result["median_s"].items()}
    new = {int(size): value for size, value in result.get("new_median_s", {}).items()}
    ratio = result["ratio"]
    target = set_limits.TARGET_SET_LIMITS_COST
    lines = [
        "",
        f"### set_limits on one queue: per-call median of {result['calls']} calls, "
        f"{len(result['rounds'])} round(s), sizes side by side",
        "",
        "| configured queues | setup (one apply_config) | set_limits per call "
        "| set_limits per call on a new queue |",
        "|--:|--:|--:|--:|",
    ]
    for size in sizes:
        setup = result["setup_s"][size] if size in result["setup_s"] else result["setup_s"][str(size)]
        on_new = f"{new[int(size)] * 1000:.2f} ms" if new else "-"
        lines.append(f"| {int(size):,} | {setup:.1f} s | {medians[int(size)] * 1000:.2f} ms | {on_new} |")
    lines += [
        "",
        f"{int(sizes[-1]):,} vs {int(sizes[0]):,} queues: {ratio:.2f}x (≤ {target}) "
        f"{'✓' if ratio <= target else '✗'}; audit() "
        f"{'clean' if not result['audit'] else str(len(result['audit'])) + ' DRIFTS'}.",
    ]
    if "new_ratio" in result:
        new_ratio = result["new_ratio"]
        lines.append(
            f"On new queues, {int(sizes[-1]):,} vs {int(sizes[0]):,} queues: {new_ratio:.2f}x "
            f"(≤ {target}) {'✓' if new_ratio <= target else '✗'}."
        )
    for key, what in (("sequence", "calls"), ("new_sequence", "calls on new queues")):
        if key in result:
            calls, seconds = result[key]["calls"], result[key]["seconds"]
            minutes = 100_000 * seconds / calls / 60
            lines.append(
                f"{calls:,} {what} in a row at {int(sizes[-1]):,} queues: {seconds:.1f} s "
                f"({calls / seconds:.0f} calls/s; 100,000 calls at that rate: {minutes:.1f} min)."
            )
    return lines


def write_json(
    path: Path,
    cfg: Config,
    cells: list[Cell],
    sweep_result: dict[str, Any] | None,
    meta: dict[str, Any],
    text: str,
) -> None:
    """Every figure of the run: the config (without the server URL), meta, the cells with their
    samples, the targets, the sweep, and the Markdown as printed."""
    payload = {
        "config": {
            k: (str(v) if isinstance(v, (Path, URL)) else v)
            for k, v in asdict(cfg).items()
            if k not in ("server_url", "mariadb_url")
        },
        "meta": meta,
        "cells": [
            {
                "pattern": cell.pattern,
                "threads": cell.threads,
                "scopes": cfg.scopes if cell.pattern == "spread" else 1,
                **{impl: cell.median(impl) for impl in IMPLEMENTATIONS},
                "library_vs_psycopg": ratio(cell.median("library"), cell.median("psycopg")),
                "library_vs_pgbench": ratio(cell.median("library"), cell.median("pgbench")),
                "samples": cell.samples,
            }
            for cell in cells
        ],
        "targets": {
            "library_vs_psycopg": throughput.TARGET_VS_PSYCOPG,
            "library_vs_pgbench": throughput.TARGET_VS_PGBENCH,
            "sweep_ratio": sweep.TARGET_SWEEP_RATIO,
            "sweep_seconds": sweep.TARGET_SWEEP_SECONDS,
            "cold_vs_warm": cold.TARGET_COLD,
            "cold_p99_ms": cold.TARGET_P99_MS,
        },
        "sweep": sweep_result,
        "markdown": text,
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    log(f"wrote {path}")


def group_commit_section(cfg: Config, results: list[dict[str, Any]]) -> list[str]:
    target = group_commit.TARGET_P99_MS
    lines = [
        "",
        f"### group commit: reserve+commit pairs/s on one hot queue, one transaction per call vs "
        f"batching=True ({cfg.seconds:g} s per cell, median of {cfg.repeat}, side by side)",
        "",
        "| backend | threads | per call | batching | batching / per call |",
        "|---|--:|--:|--:|--:|",
    ]
    for result in results:
        for threads, runs in result["threads"].items():
            per_call, batching = median(runs["per-call"]), median(runs["batching"])
            lines.append(
                f"| {result['backend']} | {threads} | {fmt_rate(per_call)} | {fmt_rate(batching)} "
                f"| {batching / per_call:.2f} |"
            )
    if any(result.get("rounds_from") == "hot" for result in results):
        lines += [
            "",
            "PostgreSQL's rows are the hot queue case's `library` and `library batching` columns "
            "(the same rounds, side by side with the service and pgbench there).",
        ]
    lines += [
        "",
        "Requests per batch (mean): "
        + ", ".join(f"{r['backend']} {r['requests_per_batch']:.1f}" for r in results)
        + ".",
        "",
        f"A quiet caller, {group_commit.PACED_RATE:g} calls/s (reserve, commit, ...), latency per call:",
        "",
        f"| backend | per call p50 / p99 ms | batching p50 / p99 ms | p99 < {target:g} ms |",
        "|---|--:|--:|--:|",
    ]
    for result in results:
        one, many = result["paced"]["per-call"], result["paced"]["batching"]
        lines.append(
            f"| {result['backend']} | {one['p50_ms']:.1f} / {one['p99_ms']:.1f} "
            f"| {many['p50_ms']:.1f} / {many['p99_ms']:.1f} | {'✓' if many['p99_ms'] < target else '✗'} |"
        )
    return lines
