"""Every recipe in README.md and docs/*.md runs as written (issue 23).

Each fenced ``python`` or ``sh`` block of a document is run, in document
order, in a fresh folder that holds what the documents name: ``~/music/gtzan``
(``HOME`` points at a small labelled corpus), ``data/gtzan.zarr``,
``data/demo.zarr``, ``data/test.zarr``, ``data/realcorpus/{train,test}.csv``,
``predictions.csv``, and links to the repository's ``Makefile``, ``.venv``,
``examples/`` and ``benchmarks/`` (so ``make ...`` and ``python
examples/...`` work there as in a clone).  A python block runs as
``python -c`` (a fresh interpreter, as if pasted), a sh block in ``bash -e``.

An HTML comment on the line before a block says how to treat it:

* ``<!-- doc-test: not run (why) -->``: not run (a cluster, a GPU, a full
  corpus); the reason is required, and such blocks must stay the minority;
* ``<!-- doc-test: file NAME -->``: the block is a file the next blocks use;
  it is written to ``NAME``;
* ``<!-- doc-test: env NAME=VALUE -->``: run with that variable (the text
  around the block tells the reader so);
* ``<!-- doc-test: needs MODULE -->``: skipped where ``MODULE`` is not installed;
* ``<!-- doc-test: unless cuda (why) -->``: not run on a CUDA machine.

Several go in one comment, separated by ``;``.  Inline ``make ...`` examples
are dry-run (``make -n``) so their quoting is checked too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from factories import make_corpus

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
LANGS = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh", "console": "sh"}
FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->$")
LINKED = (".venv", "Makefile", "pyproject.toml", "examples", "benchmarks")
BLOCK_TIMEOUT = 600  # seconds; the slowest block (README's Python API) takes well under a minute


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language (python, sh, or another), its code and directives."""

    doc: str
    line: int
    lang: str
    code: str
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in ("python", "sh") and "not run" not in self.directives


def _directives(text: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in re.split(r";(?![^()]*\))", text))):  # not inside (why)
        m = re.fullmatch(r"(not run|unless cuda)\s*\((.+)\)", part)
        if m:
            out[m.group(1)] = m.group(2)
            continue
        key, _, value = part.partition(" ")
        if key not in ("file", "env", "needs") or not value.strip():
            raise ValueError(f"{where}: unknown doc-test directive {part!r}")
        out[key] = value.strip() if key != "env" else ";".join(filter(None, (out.get("env"), value.strip())))
    return out


def blocks(doc: str) -> list[Block]:
    """The fenced blocks of ``doc`` with their directives (a marker comment on the line before a fence)."""
    lines = (ROOT / doc).read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, LANGS.get(m.group(1).lower(), m.group(1).lower())
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        marker = MARKER.match(lines[start - 1].strip()) if start else None
        where = f"{doc}:{start + 1}"
        out.append(Block(doc, start + 1, lang, "\n".join(body) + "\n",
                         _directives(marker.group(1), where) if marker else {}))
        i += 1
    return out


ALL = [b for doc in DOCS for b in blocks(doc)]


# -- the markers -------------------------------------------------------------------------------------------

def test_every_code_block_runs_or_says_why_not() -> None:
    code = [b for b in ALL if b.lang in ("python", "sh")]
    assert len(code) >= 20, [b.where for b in code]
    not_run = [b for b in code if "not run" in b.directives]
    assert all(len(b.directives["not run"]) > 10 for b in not_run), [b.where for b in not_run]
    assert len(not_run) < len(code) - len(not_run), (  # the blocks no test runs stay the minority
        f"{len(not_run)} of {len(code)} blocks are not run: {[b.where for b in not_run]}")
    others = [b.where for b in ALL if b.lang not in ("python", "sh", "")]
    assert not others, f"blocks in a language the tests do not run: {others}"
    for b in code:
        if "file" in b.directives:
            assert b.lang == "python" and "/" not in b.directives["file"], b.where


# -- running them ------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def doc_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the documents name, made once: ``HOME`` (its ``music/``) and ``data/``, ``predictions.csv``.

    Each document then runs in its own copy of ``data/`` and ``predictions.csv``; the corpora under
    ``HOME`` are only read, and stay where the stores recorded them.
    """
    import pipeline
    from infer.checkpoint import Checkpoint, save_checkpoint
    from infer.models import ModelConfig, build_model
    from infer.predict import predict
    from pipeline.testing import write_music_like
    from store import open_store

    base = tmp_path_factory.mktemp("docs")
    music = base / "home" / "music"
    make_corpus(music / "gtzan", n=6, seconds=1.5, step=0.3)
    make_corpus(music / "more", n=2, seconds=1.5, labels=("rock", "jazz"))
    data = base / "data"
    pipeline.extract(music / "gtzan", data / "gtzan.zarr", jobs=1, progress=False)  # as the README's recipe
    shutil.copytree(data / "gtzan.zarr", data / "demo.zarr")
    shutil.copytree(data / "gtzan.zarr", data / "test.zarr")
    rc = data / "realcorpus"
    for split, works in (("train", (0,)), ("test", (1,))):  # one file each: no worker pool to start
        rows = []
        for k in works:
            label = ("baroque", "jazz")[k % 2]
            write_music_like(rc / label / f"{split}{k}.wav", 1.5, seed=k)
            rows.append(f"{label}/{split}{k}.wav,{label},work{k}")
        (rc / f"{split}.csv").write_text("path,label,group\n" + "\n".join(rows) + "\n", encoding="utf-8")
    s = open_store(data / "gtzan.zarr")
    import torch

    torch.manual_seed(0)
    model = build_model(ModelConfig(n_bins=s.specs["mel"].n_bins, n_classes=len(s.label_names), width=4, depth=2))
    save_checkpoint(Checkpoint.from_model(model, s.label_names, "mel", s.specs["mel"]), base / "untrained.pt")
    predict(s, base / "untrained.pt", base / "predictions.csv", device="cpu", progress=False)
    (base / "models").mkdir()
    shutil.copy(base / "untrained.pt", base / "models" / "genre.pt")  # what docs/serving.md classifies with
    write_music_like(base / "files" / "song.mp3", 2.0, seed=3)
    write_music_like(base / "files" / "other.flac", 1.0, seed=4)
    write_music_like(base / "files" / "a.wav", 1.0, seed=5)
    write_music_like(music / "new" / "b.ogg", 1.0, seed=6)
    return base


def _workspace(base: Path, target: Path) -> Path:
    target.mkdir()
    shutil.copytree(base / "data", target / "data")
    shutil.copy(base / "predictions.csv", target / "predictions.csv")
    for f in (base / "files").iterdir():
        shutil.copy(f, target / f.name)
    for name in LINKED:
        (target / name).symlink_to(ROOT / name)
    return target


def _env(base: Path, extra: dict[str, str]) -> dict[str, str]:
    drop = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHONPATH", "SPECSTORE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(HOME=str(base / "home"), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               OMP_WAIT_POLICY="PASSIVE", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def _skip_reason(block: Block) -> str | None:
    if "needs" in block.directives and importlib.util.find_spec(block.directives["needs"]) is None:
        return f"needs {block.directives['needs']}"
    if "unless cuda" in block.directives:
        import torch

        if torch.cuda.is_available():
            return f"not on a CUDA machine ({block.directives['unless cuda']})"
    if block.lang == "sh" and re.search(r"(^|\s)make\s", block.code):
        installed = ROOT / ".venv" / ".installed"
        if not installed.exists() or installed.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
            return "make recipes need an up-to-date `make install` (.venv)"
    return None


def _run(block: Block, ws: Path, base: Path) -> None:
    if "file" in block.directives:
        path = ws / block.directives["file"]
        path.write_text(block.code, encoding="utf-8")
        compile(block.code, str(path), "exec")
        return
    extra = dict(item.split("=", 1) for item in filter(None, block.directives.get("env", "").split(";")))
    argv = [sys.executable, "-c", block.code] if block.lang == "python" else ["bash", "-e", "-c", block.code]
    proc = subprocess.run(argv, cwd=ws, env=_env(base, extra), capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT, check=False)
    assert proc.returncode == 0, (f"{block.where} ({block.lang}) exited {proc.returncode}\n--- stdout\n"
                                  f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}")


@pytest.mark.slow  # the README's recipes train and predict: about a minute on 2 cores, all documents ~2 min
@pytest.mark.parametrize("doc", [d for d in DOCS if any(b.runnable for b in blocks(d))])
def test_the_documents_recipes_run_as_written(doc: str, doc_corpus: Path, tmp_path: Path) -> None:
    ws = _workspace(doc_corpus, tmp_path / "ws")
    if doc == "docs/serving.md":  # it classifies with a model it does not train (the README trains its own)
        shutil.copytree(doc_corpus / "models", ws / "models")
    skipped = []
    for block in blocks(doc):
        if not block.runnable:
            continue
        reason = _skip_reason(block)
        if reason:
            skipped.append(f"{block.where}: {reason}")
            continue
        _run(block, ws, doc_corpus)
    if skipped and len(skipped) == sum(b.runnable for b in blocks(doc)):
        pytest.skip("; ".join(skipped))


# -- inline make examples ----------------------------------------------------------------------------------

def _make_examples() -> list[tuple[str, str]]:
    """Every inline ``make TARGET VAR=...`` example of the documents (placeholders ``…`` left out)."""
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for m in re.finditer(r"`(make [a-z][^`]*)`", text):
            example = " ".join(m.group(1).split())
            if "=" in example and "…" not in example and "..." not in example:
                found.append((doc, example))
    return found


def test_inline_make_examples_dry_run_and_quote_as_a_shell_needs() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    examples = _make_examples()
    assert len(examples) >= 8, examples
    for doc, example in examples:
        words = shlex.split(example)
        target = words[1]
        given = {w.split("=", 1)[0] for w in words[2:] if "=" in w}
        dummies = [f"{v}=x.{'zarr' if v == 'STORE' else 'pt'}" for v in ("STORE", "MODEL") if v not in given
                   and target in ("features", "plan", "infer", "init-model", "train", "eval")]
        proc = subprocess.run(f"{example} {' '.join(dummies)} VENV=/nonexistent -n --no-print-directory",
                              shell=True, executable="bash", cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env={k: v for k, v in os.environ.items() if not k.startswith(("MAKEFLAGS", "MFLAGS"))})
        assert proc.returncode == 0, (doc, example, proc.stderr)
        for line in proc.stdout.splitlines():
            if " -m " not in line:
                continue
            argv = shlex.split(line)  # every printed command is valid shell
            for k, word in enumerate(argv[:-1]):
                if word == "--model-args":
                    json.loads(argv[k + 1])
