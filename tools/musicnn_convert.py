"""Convert musicnn 0.1.0's TensorFlow checkpoints into the plain tensors specstore ships, and make the test fixture.

Run once, by hand, in a throwaway virtual environment with TensorFlow (never imported by the package, never run
by ``make install`` or CI; docs/model.md, "Pretrained musicnn")::

    python3.11 -m venv /tmp/tfvenv
    /tmp/tfvenv/bin/pip install 'tensorflow-cpu==2.21.*' tf-keras librosa soundfile
    /tmp/tfvenv/bin/pip install --no-deps musicnn==0.1.0   # its metadata pins numpy<1.17, tensorflow>=1.14
    TF_USE_LEGACY_KERAS=1 /tmp/tfvenv/bin/python tools/musicnn_convert.py

It writes, under ``infer/models/pretrained/musicnn/``:

* ``msd.npz``, ``mtt.npz``: the 64 tensors of ``MSD_musicnn`` / ``MTT_musicnn`` (792 079 parameters; the Adam
  slots and ``beta1_power``/``beta2_power`` left out), float32, keyed by the checkpoint's variable names with
  ``/`` written ``.`` (``conv2d.kernel``), saved with ``np.savez`` (no pickle);
* ``models.json``: per model its file, sha256, tag vocabulary and origin (the loader verifies the sha256);
* ``LICENSE.md`` (the wheel's ISC licence, copied) and ``ATTRIBUTION.md``.

And ``tests/fixtures/musicnn/fixture.npz``: the ORIGINAL model's per-patch outputs (sigmoid taggram,
penultimate 200-wide layer, the 753-wide mean and max pools) on three generated 16 kHz signals, from
``musicnn.extractor.extractor`` itself with one patch: its ``batch_data`` is replaced so that (a) the mel is
computed from the in-memory signal in float32 (the original casts the mel power to float16 before ``* 10000``,
which overflows on loud audio), and (b) a trailing partial patch is zero-padded to 187 frames and kept (the
original drops it), so the port's handling of partial patches is checked against TensorFlow too.  It is called
once per patch: given several patches, ``extractor()`` returns the first patch's penultimate layer for all of
them (a slip in its loop over batches), while its taggram and pools are right.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import librosa  # noqa: E402
import musicnn  # noqa: E402
import tensorflow as tf  # noqa: E402
from musicnn import configuration, extractor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "infer" / "models" / "pretrained" / "musicnn"
FIXTURE = ROOT / "tests" / "fixtures" / "musicnn" / "fixture.npz"
PACKAGE = Path(musicnn.__file__).parent
MODELS = {"musicnn-msd": ("MSD_musicnn", "msd.npz", configuration.MSD_LABELS, "Million Song Dataset (last.fm tags)"),
          "musicnn-mtt": ("MTT_musicnn", "mtt.npz", configuration.MTT_LABELS, "MagnaTagATune")}
SR = 16000
PATCH = 187


def read_checkpoint(folder: str) -> dict[str, np.ndarray]:
    """The checkpoint's model tensors (no optimiser state), float32, keyed with ``.`` for ``/``."""
    reader = tf.compat.v1.train.NewCheckpointReader(str(PACKAGE / folder) + "/")
    names = sorted(n for n in reader.get_variable_to_shape_map() if "Adam" not in n and not n.endswith("_power"))
    return {n.replace("/", "."): np.asarray(reader.get_tensor(n), dtype=np.float32) for n in names}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def convert() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    index = {}
    for name, (folder, file, labels, data) in MODELS.items():
        tensors = read_checkpoint(folder)
        n = sum(int(t.size) for t in tensors.values())
        assert len(tensors) == 64 and n == 792_079, (len(tensors), n)
        np.savez(OUT / file, **tensors)
        index[name] = {"file": file, "sha256": sha256(OUT / file), "tags": list(labels), "checkpoint": folder,
                       "trained_on": data, "parameters": n, "source": "musicnn 0.1.0 (PyPI wheel)"}
    (OUT / "models.json").write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")
    shutil.copyfile(PACKAGE.parent / "musicnn-0.1.0.dist-info" / "LICENSE.md", OUT / "LICENSE.md")
    (OUT / "ATTRIBUTION.md").write_text(ATTRIBUTION, encoding="utf-8")


ATTRIBUTION = """# musicnn weights: attribution

The tensors in `msd.npz` and `mtt.npz` are the `MSD_musicnn` and `MTT_musicnn` checkpoints of **musicnn 0.1.0**
(https://github.com/jordipons/musicnn, the PyPI wheel), converted unchanged to float32 npz by
`tools/musicnn_convert.py`. Copyright (c) Music Technology Group, Universitat Pompeu Fabra 2019; code by Jordi Pons;
ISC licence, `LICENSE.md` beside this file.

J. Pons and X. Serra, "musicnn: pre-trained convolutional neural networks for music audio tagging",
ISMIR 2019 late-breaking/demo. J. Pons, O. Nieto, M. Prockup, E. M. Schmidt, A. F. Ehmann and X. Serra,
"End-to-end learning for music audio tagging at scale", ISMIR 2018.

`MSD_musicnn` was trained on the Million Song Dataset's 50 most frequent last.fm tags, `MTT_musicnn` on the
MagnaTagATune dataset's 50 most frequent tags (vocabularies in `models.json`). The VGG variants are not shipped.
"""


def signals() -> dict[str, np.ndarray]:
    """Three generated 16 kHz signals: a chirp (4 s: one patch and a partial one), noise bursts (2 s: shorter
    than a patch) and a decaying A-major chord with harmonics (7 s: two patches and a partial one)."""
    rng = np.random.default_rng(33)
    t4 = np.arange(4 * SR) / SR
    chirp = 0.5 * np.sin(2 * np.pi * (100 * t4 + (4000 - 100) / (2 * 4) * t4**2))
    t2 = np.arange(2 * SR) / SR
    bursts = rng.standard_normal(t2.size) * 0.3 * ((t2 % 0.4) < 0.1)
    t7 = np.arange(7 * SR) / SR
    chord = sum(0.2 / h * np.sin(2 * np.pi * f * h * t7) for f in (220.0, 277.18, 329.63) for h in (1, 2, 3, 4))
    chord = chord * np.exp(-((t7 % 1.75) / 0.8))
    return {k: np.asarray(v, dtype=np.float32) for k, v in {"chirp": chirp, "bursts": bursts, "chord": chord}.items()}


def float32_mel(y: np.ndarray) -> np.ndarray:
    """The original ``batch_data`` formula without its float16 cast: ``(frames, 96)`` float32."""
    power = librosa.feature.melspectrogram(y=y, sr=SR, hop_length=configuration.FFT_HOP,
                                           n_fft=configuration.FFT_SIZE, n_mels=configuration.N_MELS).T
    return np.log10(10000 * power.astype(np.float32) + 1).astype(np.float32)


def padded_patches(mel: np.ndarray) -> np.ndarray:
    """Patches of 187 frames from frame 0, the trailing partial one zero-padded and kept."""
    n = -(-mel.shape[0] // PATCH)
    grid = np.zeros((n * PATCH, mel.shape[1]), dtype=np.float32)
    grid[: mel.shape[0]] = mel
    return grid.reshape(n, PATCH, mel.shape[1])


def fixture() -> None:
    mels = {k: float32_mel(y) for k, y in signals().items()}
    patches = {k: padded_patches(m) for k, m in mels.items()}
    original = extractor.batch_data
    # the patch: (clip, patch index) -> that one patch, from the float32 mel
    extractor.batch_data = lambda key, n_frames, overlap: (patches[key[0]][key[1] : key[1] + 1], mels[key[0]])
    out: dict[str, np.ndarray] = {}
    try:
        for name, (folder, *_rest) in MODELS.items():
            for key in mels:
                # One call per patch: for patches after a call's first, extractor() returns the first patch's
                # penultimate (and cnn1-3) layers again (it unpacks them into other names), so one patch a call.
                runs = [extractor.extractor((key, i), model=folder, extract_features=True)
                        for i in range(patches[key].shape[0])]
                out[f"{name}/{key}/taggram"] = np.concatenate([r[0] for r in runs]).astype(np.float32)
                for layer in ("penultimate", "mean_pool", "max_pool"):
                    out[f"{name}/{key}/{layer}"] = np.concatenate([r[2][layer] for r in runs]).astype(np.float32)
    finally:
        extractor.batch_data = original
    for key, mel in mels.items():
        out[f"mel/{key}"] = mel
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(FIXTURE, **out)


def main() -> int:
    if "--fixture-only" not in sys.argv:
        convert()
    fixture()
    return 0


if __name__ == "__main__":
    sys.exit(main())
