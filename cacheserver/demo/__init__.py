"""``cacheserver demo``: the parent (:mod:`.main`), its data and model (:mod:`.data`)
and one training run in a child process (:mod:`.job`).
"""
