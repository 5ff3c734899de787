"""The two shipped taggers say what music they know: ``--list-tags``, ``classify --help`` and the README.

``musicnn-msd``'s 50 last.fm tags have no classical tag, so it calls
orchestral and classical recordings ambient or instrumental; ``musicnn-mtt``
tags them classical, strings, violin.  The texts are checked against the
models' own vocabularies (``infer/models/pretrained/musicnn/models.json``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specstore.infer.models.pretrained import musicnn_info
from specstore.serving.cli import CLASSIFY_EPILOG
from specstore.serving.cli import main as specstore_main

ROOT = Path(__file__).resolve().parents[2]
MSD, MTT = (musicnn_info(n)["tags"] for n in ("musicnn-msd", "musicnn-mtt"))
CLASSICAL = ("classical", "strings", "violin", "cello", "piano", "harpsichord", "choir", "opera")


def test_the_vocabularies_are_what_the_texts_rely_on() -> None:
    assert not any("classical" in t.lower() or "orchestra" in t.lower() for t in MSD)
    assert set(CLASSICAL) <= set(MTT)


@pytest.mark.parametrize("name", ["musicnn-msd", "musicnn-mtt"])
def test_list_tags_prints_the_tags_and_the_music_each_fits(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert specstore_main(["classify", "--list-tags", "--model", name]) == 0
    out, err = capsys.readouterr()
    tags = MSD if name == "musicnn-msd" else MTT
    assert out.splitlines() == tags
    lines = err.splitlines()
    assert lines[0] == f"# {name}: 50 tags (independent scores)" and lines[1].startswith("# fits ")
    fits = lines[1]
    named = re.split(r",\s*(?:and\s+)?", fits.split(": ", 1)[1].split(";")[0])
    known = {t.lower() for t in tags}
    assert [t for t in named if t.lower() not in known and " " not in t] == [], named  # names only its own tags
    if name == "musicnn-msd":
        assert "no classical tag" in fits and "use musicnn-mtt" in fits
    else:
        assert fits.startswith("# fits classical and orchestral music") and all(t in fits for t in CLASSICAL)
        assert "use musicnn-msd" in fits


def test_help_and_readme_send_classical_music_to_mtt() -> None:
    for text in (CLASSIFY_EPILOG, (ROOT / "README.md").read_text()):
        flat = " ".join(text.split())
        assert re.search(r"classical and orchestral music belongs to `?musicnn-mtt", flat, re.I), flat[:200]
        assert re.search(r"musicnn-msd`? (is )?for popular music", flat), flat[:200]
        assert "no classical tag" in flat
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"Classical and orchestral music belongs to `musicnn-mtt`, whose tags include ([^(]*)\(", readme)
    assert said is not None
    claimed = [t.strip(" .") for t in re.split(r",|\band\b", said.group(1)) if t.strip(" .")]
    assert len(claimed) >= 8 and set(claimed) <= set(MTT), claimed
