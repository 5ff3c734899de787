"""The seven style recipes, one module each: ``arrange(ctx) -> Arrangement``.

A recipe draws everything about a file from ``ctx.rng`` (tempo, key,
progression, arrangement variant, optional instruments, balance, room, song
form) and synthesises its stems at ``ctx.sr``, each tagged with its role in the
band (drums, bass, chords, lead, texture) for the song form.  Instruments and
parts that neighbouring styles share come from :mod:`specstore.democorpus.parts`.  The
order of the draws is part of the corpus: reordering them, or drawing once more,
changes every later sample of the file.
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
"""Style name (see :data:`specstore.democorpus.plan.STYLES`) -> recipe."""
