"""NumPy without TensorFlow: read a cache as arrays (:mod:`.reader`, cc.numpy()).

Nothing here imports tensorflow or client.tf (an import-linter contract in
pyproject.toml holds it), so ``pip install shardcache`` without the tf extra
reads every cache: chunks run ahead on a few threads (:mod:`.prefetch`) and
become elements or batches of the stored structure (:mod:`.batches`).
"""
