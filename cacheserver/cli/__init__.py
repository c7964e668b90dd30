"""The ``cacheserver`` command line (:mod:`.main`) and its ``materialize`` command."""
