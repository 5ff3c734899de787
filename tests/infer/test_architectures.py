"""The registries of model parts (infer/models/registry.py) and an architecture registered from user code.

The user architecture is ``docs/architectures.md``'s example module, run as the document shows it; its
checkpoints build where it is registered, and elsewhere only when its module is trusted (infer/models/trust.py).
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from factories import LABELS, SPEC16

from specstore.common import ConfigError
from specstore.infer.models import build_model
from specstore.infer.models.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from specstore.infer.models.config import ARCHS, FREQ_POOLINGS, POOLINGS, ModelConfig, ModelConfigError
from specstore.infer.models.contract import ModelSpec, spec_of
from specstore.infer.models.registry import ARCH_REGISTRY, Arch, RegistryError
from specstore.infer.models.trust import TRUST_ENV, UntrustedModelError

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architectures.md"

# every part pinned: ModelConfig's defaults are not what these tests are about
PARTS: dict[str, Any] = {"pooling": "meanstd", "freq_pooling": "mean", "stem_freq_kernel": 3, "input_time_pool": 1}


def documented_module() -> str:
    """The example module of docs/architectures.md: the python block after its ``file tiny_arch.py`` marker."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"<!-- doc-test: file tiny_arch\.py -->\n```python\n(.*?)```", text, re.S)
    assert match is not None, "docs/architectures.md lost its example module"
    return match.group(1)


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """The documented module under a fresh name (importable, not yet imported); the registry as it was after."""
    name = f"tiny_arch_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / f"{name}.py").write_text(documented_module(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delenv(TRUST_ENV, raising=False)
    saved = dict(ARCH_REGISTRY._entries)
    yield name, folder
    forget(name, saved)


def forget(module: str, saved: dict[str, Arch]) -> None:
    """As a fresh process: ``module`` not imported, the registry holding only ``saved``."""
    ARCH_REGISTRY._entries.clear()
    ARCH_REGISTRY._entries.update(saved)
    sys.modules.pop(module, None)


def register(module: str) -> ModuleType:
    import importlib

    return importlib.import_module(module)


def tiny_config(n_bins: int = 16, **overrides: object) -> ModelConfig:
    return ModelConfig(**{"arch": "tiny", "n_bins": n_bins, "n_classes": len(LABELS), "width": 8, "depth": 1,
                          **PARTS, **overrides})  # type: ignore[arg-type]


def test_the_documented_architecture_is_a_model_like_the_builtins(tiny: tuple[str, Path]) -> None:
    module, _ = tiny
    assert "tiny" not in ARCHS
    with pytest.raises(ModelConfigError, match="unknown arch 'tiny'"):
        tiny_config()
    register(module)
    assert "tiny" in ARCHS and ARCHS[-1] == "tiny"  # the one list, seen live by every reader
    for pooling, freq_pooling, stats_head in itertools.product(POOLINGS, FREQ_POOLINGS, (False, True)):
        config = tiny_config(pooling=pooling, freq_pooling=freq_pooling, stats_head=stats_head)
        model = build_model(config).eval()
        assert type(model).__name__ == "TinyNet" and model.time_stride == 2
        assert sum(p.numel() for p in model.parameters()) == config.n_parameters, (pooling, freq_pooling)
    x, lengths = torch.randn(2, 1, 16, 40), torch.tensor([40, 17])
    with torch.no_grad():
        torch.testing.assert_close(model(x, lengths)[1], model(x[1:, ..., :17], lengths[1:])[0], atol=1e-4, rtol=0)
    spec = spec_of(model)
    assert (spec.target, spec.builder, spec.builtin) == ("tiny", f"{module}:TinyNet", True)
    assert ModelSpec.from_dict(spec.to_dict()) == spec


def test_a_checkpoint_of_a_registered_architecture_builds_elsewhere_only_when_trusted(
        tiny: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, _ = tiny
    saved = dict(ARCH_REGISTRY._entries)
    register(module)
    model = build_model(tiny_config(stats_head=True)).eval()
    path = save_checkpoint(Checkpoint.from_model(model, LABELS, "mel", SPEC16), tmp_path / "tiny.pt")
    x, lengths = torch.randn(3, 1, 16, 30), torch.tensor([30, 9, 1])
    with torch.no_grad():
        expected = model(x, lengths)
        torch.testing.assert_close(load_checkpoint(path).build()(x, lengths), expected)  # registered here

    forget(module, saved)  # another process: nothing registered "tiny"
    ckpt = load_checkpoint(path)
    assert ckpt.model.builder == f"{module}:TinyNet" and ckpt.config is None
    with pytest.raises(UntrustedModelError, match="--trust-model-code"):
        ckpt.build()
    assert module not in sys.modules and "tiny" not in ARCHS  # refused before anything was imported
    with torch.no_grad():
        torch.testing.assert_close(ckpt.build(trust_model_code=[module])(x, lengths), expected)

    forget(module, saved)
    monkeypatch.setenv(TRUST_ENV, module)
    with torch.no_grad():
        torch.testing.assert_close(load_checkpoint(path).build()(x, lengths), expected)


def test_a_checkpoint_cannot_redirect_a_name_or_import_an_untrusted_builder(tiny: tuple[str, Path]) -> None:
    module, _ = tiny
    kwargs = {"n_bins": 16, "n_classes": 3, "width": 4, "depth": 1, **PARTS}
    with pytest.raises(ConfigError, match="registers it as 'specstore.infer.models.cnn:SpectrogramCNN'"):
        ModelSpec("cnn", kwargs, builder="os:system").build(trust_model_code=True)
    with pytest.raises(UntrustedModelError):
        ModelSpec("evil", kwargs, builder="os:system").build()
    register(module)
    with pytest.raises(ConfigError, match="was built by 'elsewhere:TinyNet' when saved"):
        ModelSpec("tiny", kwargs, builder="elsewhere:TinyNet").build(trust_model_code=True)
    assert ModelSpec("cnn", kwargs).to_dict() == {"target": "cnn", "kwargs": kwargs}  # built-ins: no builder


def test_a_name_is_registered_once(tiny: tuple[str, Path]) -> None:
    module, _ = tiny
    register(module)
    entry = ARCH_REGISTRY.get("tiny")
    assert ARCH_REGISTRY.register(Arch("tiny", entry.builder, entry.n_parameters)) is not entry  # re-import
    with pytest.raises(RegistryError, match="already registered"):
        ARCH_REGISTRY.register(Arch("cnn", f"{module}:TinyNet", entry.n_parameters))
    with pytest.raises(RegistryError, match="identifier"):
        ARCH_REGISTRY.register(Arch("not a name", f"{module}:TinyNet", entry.n_parameters))
    assert not entry.builtin and ARCH_REGISTRY.get("cnn").builtin


@pytest.mark.parametrize("arch", ["cnn", "resnet"])
def test_every_registered_part_counts_its_parameters_as_built(arch: str) -> None:
    for pooling, freq_pooling, stats_head in itertools.product(POOLINGS, FREQ_POOLINGS, (False, True)):
        config = ModelConfig(arch=arch, n_bins=20, n_classes=4, width=4, depth=2, blocks_per_stage=1,
                             pooling=pooling, freq_pooling=freq_pooling, stats_head=stats_head, stem_freq_kernel=5,
                             input_time_pool=2)
        assert sum(p.numel() for p in build_model(config).parameters()) == config.n_parameters, config


def test_state_dict_keys_are_those_checkpoints_have_always_held() -> None:
    config = ModelConfig(arch="cnn", n_bins=16, n_classes=3, width=4, depth=1, pooling="attention",
                         freq_pooling="keep", stats_head=True, stem_freq_kernel=3, input_time_pool=1)
    assert list(build_model(config).state_dict()) == [
        "stats_shift", "stats_scale", "blocks.0.conv.weight", "blocks.0.bn.weight", "blocks.0.bn.bias",
        "blocks.0.bn.running_mean", "blocks.0.bn.running_var", "blocks.0.bn.num_batches_tracked", "head.weight",
        "head.bias", "attention.weight", "attention.bias", "stats_linear.weight", "stats_linear.bias"]


def test_classify_takes_the_sums_of_its_own_mode() -> None:
    """The flat sums' layout follows the model's mode (eval with a statistics head carries the statistics),
    never their width: sums of the other layout are refused."""
    config = ModelConfig(arch="cnn", n_bins=16, n_classes=3, width=4, depth=1, stats_head=True, **PARTS)
    model = build_model(config).eval()
    x, lengths = torch.randn(2, 1, 16, 20), torch.tensor([20, 7])
    with torch.no_grad():
        sums, counts = model.pooled_sum(x, lengths)
        pooled = model.pooled(x, lengths)
        assert pooled.stats is not None and sums.shape[1] == pooled.sums.shape[1] + pooled.stats.flat().shape[1]
        torch.testing.assert_close(model.classify(sums, counts), model.classify_pooled(pooled))
        with pytest.raises(ValueError, match="columns"):
            model.classify(pooled.sums, counts)


def test_the_document_lists_every_registered_part() -> None:
    from specstore.infer.models.registry import FREQ_POOLING_REGISTRY, POOLING_REGISTRY

    table = {line.split("|")[1].strip(): line for line in DOC.read_text(encoding="utf-8").splitlines()
             if line.startswith("| ")}
    for kind, registry in (("architecture", ARCH_REGISTRY), ("time pooling", POOLING_REGISTRY),
                           ("frequency pooling", FREQ_POOLING_REGISTRY)):
        assert all(f"`{name}`" in table[kind] for name in registry.names), kind


def test_the_registry_and_the_names_load_no_torch() -> None:
    code = ("import sys; from specstore.infer.models.registry import ARCH_REGISTRY; "
            "from specstore.infer.models.config import ARCHS, ModelConfig; "
            "assert ARCHS is ARCH_REGISTRY.names and ModelConfig(arch='resnet').n_parameters > 0; "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                          cwd=ROOT)
    assert proc.stdout.strip() == "False", proc.stderr


def test_the_models_package_exports_what_type_checkers_see() -> None:
    import ast

    import specstore.infer.models as models

    tree = ast.parse((ROOT / "infer" / "models" / "__init__.py").read_text(encoding="utf-8"))
    typed = {alias.name for node in ast.walk(tree) if isinstance(node, ast.If)
             for stmt in node.body if isinstance(stmt, ast.ImportFrom) for alias in stmt.names}
    assert typed == set(models.__all__)
    for name in models.__all__:
        assert getattr(models, name) is not None, name
