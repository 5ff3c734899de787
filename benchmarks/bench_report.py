"""Writing the results: ``benchmarks.json`` (machine-readable) and ``benchmarks.md`` (the doc)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .bench_common import Figure, GroupResult


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v == 0 or abs(v) >= 100:
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:g}"
    return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"


def _met(m: bool | None) -> str:
    return {True: "yes", False: "**NO**", None: "-"}[m]


def to_json(groups: list[GroupResult], meta: dict[str, Any]) -> dict[str, Any]:
    """The report as ``benchmarks.json`` holds it: ``meta`` (with the run's ``started`` time and unique ``run``
    id), every group with the run that measured it, a summary, and every figure under its key."""
    figures = {f.key: {**f.to_dict(), "group": g.name} for g in groups for f in g.figures}
    with_target = [f for f in figures.values() if f["met"] is not None]
    return {
        **meta,
        "groups": {g.name: {"method": g.method, "profile": g.profile, "seconds": round(g.seconds, 1),
                            "measured": g.measured or meta["started"], "run": g.run or meta["run"]}
                   for g in groups},
        "summary": {"figures": len(figures), "with_target": len(with_target),
                    "met": sum(1 for f in with_target if f["met"]),
                    "missed": [k for k, f in figures.items() if f["met"] is False],
                    "not_measured": [k for k, f in figures.items() if f["value"] is None]},
        "figures": figures,
    }


def _details_line(d: dict[str, Any]) -> str:
    keep = []
    for k, v in d.items():
        if isinstance(v, dict):
            v = ", ".join(f"{a} {b}" for a, b in v.items())
        elif isinstance(v, list):
            if len(v) > 8:
                continue
            v = ", ".join(str(x) for x in v)
        keep.append(f"{k}: {v}")
    return "; ".join(keep)


def from_earlier_run(group: GroupResult, doc: dict[str, Any]) -> bool:
    """Whether ``group`` was kept from an earlier run (``--merge``) rather than measured in the run of ``doc``.

    Run ids are compared, not times: a merge that starts in the same minute as the run it keeps figures from
    still marks them with their date.
    """
    return bool(group.run) and group.run != doc["run"]


def to_markdown(doc: dict[str, Any], groups: list[GroupResult]) -> str:
    m = doc["machine"]
    v = m["versions"]
    s = doc["summary"]
    lines = [
        "# Benchmarks",
        "",
        "Performance of specstore side by side with what users would otherwise run. Every figure is a ratio "
        "measured in one run, with the compared variants interleaved inside each repeat (their order rotating "
        "from repeat to repeat), so a burst of load from elsewhere hits all of them; values are medians over "
        "repeats. This file and `benchmarks.json` are written by the benchmark itself: do not edit them by hand.",
        "",
        f"Reproduce: `{doc['command']}` (about {doc['wall_seconds'] / 60:.0f} min here; `make bench QUICK=1` is a "
        f"smoke run of tiny sizes that checks the machinery, not the figures).",
        "",
        "## Machine",
        "",
        f"- CPU: {m['cpu_model']}, {m['cores']} cores available"
        f"{' (avx512_bf16)' if m.get('avx512_bf16') else ''}; RAM {m['ram_gib']} GiB; {m['os']}; "
        f"GPU: {m['gpu'] or 'none'}",
        f"- Python {v['python']}, torch {v['torch']}, numpy {v['numpy']}, zarr {v['zarr']}, librosa {v['librosa']}, "
        f"soundfile {v['soundfile']}, soxr {v['soxr']}, scipy {v['scipy']}, joblib {v['joblib']}",
        f"- Run {doc['started']} ({'QUICK smoke run' if doc['quick'] else 'full run'}), "
        f"{doc['wall_seconds']:.0f} s. Load average (1/5/15 min) before: "
        f"{' / '.join(f'{x:.2f}' for x in doc['load_before'])}; after: "
        f"{' / '.join(f'{x:.2f}' for x in doc['load_after'])}. Each figure's details give `foreign_cores` where "
        "relevant: the average number of cores busy with other processes during the timed runs.",
        "",
        "## Results",
        "",
        *(["Groups marked \"measured DATE\" under \"How each group was measured\" were kept from an earlier "
           "run (`--merge`); the rest were measured in this one.", ""]
          if any(from_earlier_run(g, doc) for g in groups) else []),
        *([f"Not run here: {'; '.join(f'`{k}` ({why})' for k, why in doc['skipped'].items())}.", ""]
          if doc.get("skipped") else []),
        f"{s['met']} of {s['with_target']} targets met"
        + (f"; missed: {', '.join('`' + k + '`' for k in s['missed'])}" if s["missed"] else "")
        + (f"; not measured: {', '.join('`' + k + '`' for k in s['not_measured'])}" if s["not_measured"] else "")
        + ".",
        "",
        "| figure | value | target | met |",
        "|---|---|---|---|",
    ]
    for g in groups:
        for f in g.figures:
            target = f"{f.op} {_fmt(f.target)}" if f.target is not None else "(info)"
            if f.value is None:
                target = "-"
            value = f"{_fmt(f.value)} {f.unit}" if f.value is not None else "not measured"
            lines.append(f"| {f.title} (`{f.key}`) | {value} | {target} | {_met(f.met)} |")
    lines += ["", "## How each group was measured", ""]
    for g in groups:
        when = f", measured {g.measured or '?'}" if from_earlier_run(g, doc) else ""
        lines += [f"### {g.name[:1].upper() + g.name[1:]} ({g.seconds:.0f} s{when})", "", g.method, ""]
        for f in g.figures:
            lines.append(
                f"- `{f.key}`: {f.description}." + (f" {f.note}" if f.note and f.note != f.description else "")
            )
            if f.details:
                lines.append(f"  Details: {_details_line(f.details)}.")
        if g.profile:
            lines += ["", "Where the time goes (the run missed a target):", "", "```", g.profile, "```"]
        lines.append("")
    notes = doc.get("notes") or []
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def write(out_dir: Path, groups: list[GroupResult], meta: dict[str, Any]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = to_json(groups, meta)
    jp = out_dir / "benchmarks.json"
    mp = out_dir / "benchmarks.md"
    jp.write_text(json.dumps(doc, indent=2) + "\n")
    mp.write_text(to_markdown(doc, groups))
    return jp, mp


def merged(old: dict[str, Any], groups: list[GroupResult]) -> list[GroupResult]:
    """``groups`` (just measured) with the other groups of an earlier report ``old`` (``benchmarks.json``),
    rebuilt with their figures, method, measurement date and the id of the run that measured them, in
    ``old``'s order: rerunning one group keeps the others.  (A report written before run ids were recorded
    gets the id ``earlier <its start time>``: anything but the new run's id says "kept".)"""
    info = old.get("groups", {})
    rerun = {g.name: g for g in groups}
    combined: dict[str, GroupResult] = {}
    for key, f in old.get("figures", {}).items():
        name = f["group"]
        if name in rerun:
            group = combined.setdefault(name, rerun[name])
            if group.partial and key not in {g.key for g in group.figures}:  # a figure this run did not measure
                when = info.get(name, {}).get("measured") or old.get("started", "")
                kept = Figure.from_dict(key, f)
                if not kept.note.startswith(("(measured ", "measured ")):  # kept twice: its first date stays
                    kept.note = f"(measured {when})" + (f" {kept.note}" if kept.note else "")
                group.figures.append(kept)
            continue
        g = info.get(name, {})
        group = combined.setdefault(name, GroupResult(
            name, [], method=g.get("method", ""), profile=g.get("profile", ""), seconds=g.get("seconds", 0.0),
            measured=g.get("measured", old.get("started", "")),
            run=g.get("run") or old.get("run") or f"earlier {old.get('started', '')}".strip()))
        group.figures.append(Figure.from_dict(key, f))
    return list(combined.values()) + [g for g in groups if g.name not in combined]
