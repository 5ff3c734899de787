"""specstore's serving side: classify audio files directly (``specstore classify``) and serve a model over
HTTP (``specstore serve``).

It joins the two stages that never import each other: :mod:`specstore.serving.clips`
decodes a file with the pipeline (the checkpoint's FeatureSpecs, the values
a store would hold), :mod:`specstore.serving.model` runs clips on infer's Engine
(Budget, planner, windows, OOM split).  :mod:`specstore.serving.policy` and
:mod:`specstore.serving.batcher` are the online batcher, :mod:`specstore.serving.decode_pool`
the decode workers, :mod:`specstore.serving.service` the classify service (typed
answers and errors), :mod:`specstore.serving.app` its thin Starlette layer (with
:mod:`specstore.serving.responses`), :mod:`specstore.serving.uploads` admits uploads by bytes and
streams them to disk, :mod:`specstore.serving.connections` holds read deadlines and
connection caps below the ASGI layer, :mod:`specstore.serving.server` runs it all
(port first, model behind a 503), :mod:`specstore.serving.cli` the commands.  Importing this package
imports neither torch nor the audio stack (decode workers import only
:mod:`specstore.serving.clips`).
"""

if __name__ != "specstore.serving":  # one name per module: the folder is imported through specstore/
    raise ImportError(f"specstore's serving/ is the package specstore.serving; import it by that name, not as "
                      f"{__name__!r}")
