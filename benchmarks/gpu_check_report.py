"""The gpu-check report: figures and step outcomes rewritten to JSON and Markdown after every change, and the
merge of a report into docs/benchmarks.md / .json (see gpu_check)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["Report", "markdown", "merge"]


class Report:
    """Figures and step outcomes, rewritten to JSON and Markdown after every change."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.doc: dict[str, Any] = {**meta, "steps": {}, "figures": {}}
        self.write()

    def step(self, name: str, **fields: Any) -> None:
        self.doc["steps"][name] = fields
        self.write()

    def figure(self, key: str, title: str, value: float | None, unit: str, description: str, *,
               target: float | None = None, op: str | None = None, details: dict[str, Any] | None = None,
               note: str = "") -> None:
        met = None
        if value is not None and target is not None and op is not None:
            met = bool(value >= target) if op == ">=" else bool(value <= target)
        self.doc["figures"][key] = {"title": title, "value": value, "unit": unit, "description": description,
                                    "target": target, "op": op, "met": met, "details": details or {},
                                    "note": note}
        self.write()

    def write(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.doc, indent=2, default=str) + "\n")
        (self.out / "gpu_check.md").write_text(markdown(self.doc))


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def markdown(doc: dict[str, Any]) -> str:
    """The report as a Markdown section (what ``--merge`` puts into docs/benchmarks.md)."""
    lines = [f"## GPU ({doc.get('device', 'no CUDA device')})", "",
             f"Measured {doc.get('date', '?')} by `make gpu-check` ({doc.get('mode', '')}); torch "
             f"{doc.get('torch', '?')}, CUDA {doc.get('cuda', '?')}. Ratios are measured side by side in one run.",
             "", "| figure | value | target | met |", "|---|---|---|---|"]
    for key, f in doc.get("figures", {}).items():
        target = "-" if f["target"] is None else f"{f['op']} {_fmt(f['target'])}"
        met = {True: "yes", False: "**NO**", None: "-"}[f["met"]]
        lines.append(f"| `{key}`: {f['title']} | {_fmt(f['value'])} {f['unit']} | {target} | {met} |")
    lines.append("")
    for key, f in doc.get("figures", {}).items():
        extra = f" {f['note']}" if f.get("note") else ""
        lines.append(f"- `{key}`: {f['description']}.{extra}")
    tests = doc.get("steps", {}).get("cuda-tests")
    if tests:
        lines += ["", f"CUDA tests: {tests.get('summary', '?')} (`pytest -m gpu`, {tests.get('seconds', '?')} s)."]
    failed = [name for name, st in doc.get("steps", {}).items() if st.get("status") == "failed"]
    if failed:
        lines += ["", f"Steps that failed: {', '.join(failed)} (see gpu_check.json)."]
    return "\n".join(lines) + "\n"


def merge(report_json: Path, docs: Path) -> None:
    """Put a report's figures into docs/benchmarks.json (``gpu`` key) and docs/benchmarks.md (a GPU section)."""
    doc = json.loads(report_json.read_text())
    bench_json = docs / "benchmarks.json"
    bench = json.loads(bench_json.read_text()) if bench_json.exists() else {}
    bench["gpu"] = doc
    bench_json.write_text(json.dumps(bench, indent=2, default=str) + "\n")
    md = docs / "benchmarks.md"
    text = md.read_text() if md.exists() else "# Benchmarks\n"
    start = text.find("\n## GPU (")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + ("" if end < 0 else text[end:])
    md.write_text(text.rstrip("\n") + "\n\n" + markdown(doc))
