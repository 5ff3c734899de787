"""specstore's serving side: classify audio files directly (``specstore classify``) and serve a model over
HTTP (``specstore serve``).

It joins the two stages that never import each other: :mod:`serving.clips`
decodes a file with the pipeline (the checkpoint's FeatureSpecs, the values
a store would hold), :mod:`serving.model` runs clips on infer's Engine
(Budget, planner, windows, OOM split).  :mod:`serving.policy` and
:mod:`serving.batcher` are the online batcher, :mod:`serving.decode_pool`
the decode workers, :mod:`serving.service` the classify service (typed
answers and errors), :mod:`serving.app` its thin Starlette layer (with
:mod:`serving.responses`), :mod:`serving.uploads` admits uploads by bytes and
streams them to disk, :mod:`serving.connections` holds read deadlines and
connection caps below the ASGI layer, :mod:`serving.server` runs it all
(port first, model behind a 503), :mod:`serving.cli` the commands.  Importing this package
imports neither torch nor the audio stack (decode workers import only
:mod:`serving.clips`).
"""
