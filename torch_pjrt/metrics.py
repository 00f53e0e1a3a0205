"""Counters: compiles, cache hits, executions, graphs, syncs, transfers, CPU fallbacks."""

from __future__ import annotations

from typing import Any

from . import _C, distributed, recompiles


def metrics() -> dict[str, Any]:
    m = dict(_C._metrics())
    m["compiled"] = recompiles.compiled_stats()  # per torch.compile'd function
    m["distributed"] = distributed.stats_with(m.pop("collectives_in_programs"))
    return m


def reset_metrics() -> None:
    _C._reset_metrics()
    _C._reset_transport_stats()
    recompiles.reset_compiled_stats()


def _per_graph(m: dict[str, Any]) -> str:
    return f"{m['graph_ops'] / m['graphs']:.1f}" if m["graphs"] else "0"


def metrics_report() -> str:
    m = metrics()
    lines = [
        "torch_pjrt metrics",
        f"  compiles            {m['compiles']} ({m['compile_seconds']:.2f} s)",
        f"  memory cache hits   {m['memory_cache_hits']} (evictions: {m['memory_cache_evictions']})",
        f"  disk cache hits     {m['disk_cache_hits']} (rejected entries: {m['disk_cache_rejects']}; "
        f"written: {m['disk_cache_stores']}; evicted: {m['disk_cache_evictions']})",
        f"  waits for another process's compile {m['disk_cache_waits']} ({m['disk_cache_wait_seconds']:.2f} s; "
        f"stale locks taken over: {m['disk_cache_stale_locks']}; waits given up: {m['disk_cache_lock_timeouts']})",
        f"  executions          {m['executions']}",
        f"  host syncs          {m['host_syncs']}",
        f"  host->device bytes  {m['host_to_device_bytes']}",
        f"  device->host bytes  {m['device_to_host_bytes']}",
        f"  ops recorded        {m['ops_recorded']}",
        f"  graphs run          {m['graphs']} ({_per_graph(m)} ops per graph, at most {m['max_graph_ops']})",
        f"  graph outputs       {m['graph_outputs']} (pending values dropped unread: {m['dropped_values']})",
        f"  donated buffers     {m['donated_buffers']}",
    ]
    reasons = m["flush_reasons"]
    if reasons:
        lines.append("  graphs cut by       " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())))
    fallbacks = m["fallbacks"]
    total = sum(fallbacks.values())
    lines.append(f"  CPU fallbacks       {total} calls over {len(fallbacks)} ops")
    for op, n in sorted(fallbacks.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {op:40s} {n}")
    compiles = m["compiles_by_op"]
    if compiles:
        lines.append("  compiles by op")
        for op, n in sorted(compiles.items(), key=lambda kv: -kv[1])[:20]:
            lines.append(f"    {op:40s} {n}")
    return "\n".join(lines)
