"""Running a model over a store: the engine, its device and memory figures, windows, predictions.

:mod:`~specstore.infer.engine.runtime` (:class:`Engine`: device, precision,
budget, plan, batch loop; one for train, predict and eval),
:mod:`~specstore.infer.engine.device`, :mod:`~specstore.infer.engine.cost`
(a model's measured bytes per padded clip-frame),
:mod:`~specstore.infer.engine.windows` (clips too long for any batch),
:mod:`~specstore.infer.engine.predict` (a store's predictions) and
:mod:`~specstore.infer.engine.predictions` (the predictions CSV).
"""
