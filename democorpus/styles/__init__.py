"""The seven style recipes, one module each: ``arrange(ctx) -> Arrangement``.

A recipe draws everything about a file from ``ctx.rng`` (tempo, key,
progression, instruments, balance, room) and synthesises its stems at
``ctx.sr``.  The order of the draws is part of the corpus: reordering them, or
drawing once more, changes every later sample of the file.
"""

from __future__ import annotations

from collections.abc import Callable

from ..arrangement import Arrangement
from ..dsp import Ctx
from . import ambient, classical, hiphop, jazz, reggae, rock, techno

__all__ = ["RECIPES"]

RECIPES: dict[str, Callable[[Ctx], Arrangement]] = {
    "ambient": ambient.arrange,
    "classical": classical.arrange,
    "hiphop": hiphop.arrange,
    "jazz": jazz.arrange,
    "reggae": reggae.arrange,
    "rock": rock.arrange,
    "techno": techno.arrange,
}
"""Style name (see :data:`democorpus.plan.STYLES`) -> recipe."""
