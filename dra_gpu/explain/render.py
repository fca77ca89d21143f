"""A :class:`~dra_gpu.explain.analysis.Report` as data (json/yaml) and as a table for people."""

from __future__ import annotations

from typing import Any

from dra_gpu.explain.analysis import NeedReport, Report

JSON = dict[str, Any]


def _request(r: NeedReport) -> JSON:
    need = r.need
    out: JSON = {
        "request": need.name,
        "deviceClassName": need.device_class,
        "selectors": list(need.selectors),
        "wants": "All" if need.all_devices else need.count,
    }
    if r.problem:
        out["problem"] = r.problem
    out["nodes"] = [
        {
            "node": c.node,
            "pools": c.pools,
            "devices": c.devices,
            "passClass": c.stages[0] if c.stages else 0,
            "passSelectors": c.stages[1:],
            "allocatedToOthers": c.allocated,
            "tainted": c.tainted,
            "available": c.available,
        }
        for c in r.nodes
    ]
    out["ruledOut"] = [
        {
            "by": f.stage,
            **({"expression": f.expression} if f.expression else {}),
            "devices": f.devices,
            **({"celError": f.error} if f.error else {}),
            **({"values": f.values} if f.values else {}),
        }
        for f in r.failures
    ]
    return out


def as_data(report: Report) -> JSON:
    return {
        "claim": report.claim,
        "satisfiable": report.satisfiable,
        "fitsOn": report.fits,
        "requests": [_request(r) for r in report.requests],
        "constraints": report.constraints,
        "suggestions": report.suggestions,
        "notes": report.notes,
    }


def as_table(report: Report) -> str:
    lines = [f"claim {report.claim}: " + _verdict(report)]
    for r in report.requests:
        need = r.need
        wants = "all" if need.all_devices else str(need.count)
        lines.append(f"\nrequest {need.name}: {wants} of class {need.device_class}")
        for i, e in enumerate(need.selectors, 1):
            lines.append(f"  selector {i}: {e}")
        if r.problem:
            lines.append(f"  problem: {r.problem}")
            continue
        head = ["NODE", "DEVICES", "CLASS"] + [f"SEL{i}" for i in range(1, len(need.selectors) + 1)]
        head += ["ALLOCATED", "TAINTED", "AVAILABLE"]
        rows = [head]
        for c in r.nodes:
            rows.append(
                [
                    c.node,
                    str(c.devices),
                    *(str(n) for n in c.stages),
                    str(c.allocated),
                    str(c.tainted),
                    str(c.available),
                ]
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
        cells = ("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows)
        lines += [f"  {line}".rstrip() for line in cells]
        for f in r.failures:
            what = f"  ruled out by {f.stage}: {f.devices} device(s)"
            if f.expression:
                what += f" ({f.expression})"
            if f.error:
                what += f"; CEL error: {f.error}"
            lines.append(what)
            for name, values in f.values.items():
                lines.append(f"    {name}: {', '.join(repr(v) for v in values)}")
    if report.constraints:
        lines.append(f"\nconstraints: {report.constraints}")
    for s in report.suggestions:
        lines.append(f"\nto make it fit: {s}")
    for n in report.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def _verdict(report: Report) -> str:
    if not report.satisfiable:
        return "cannot be allocated on any node"
    shown = ", ".join(report.fits[:10]) + (" …" if len(report.fits) > 10 else "")
    return f"fits on {len(report.fits)} node(s): {shown}"
