"""The TensorFlow adapter: the only client modules that import tensorflow.

Element specs and layouts, batches in and out of tf.data (:mod:`.convert`), the
datasets cc.dataset() and cc.cache() return (:mod:`.builder`, :mod:`.datasets`),
checkpointable reads (:mod:`.reads`, :mod:`.flat_arrays`), cc.cache()'s iterations
(:mod:`.iterations`), pipelines as graphs for fingerprints and shipping
(:mod:`.graphs`), the write-through tap (:mod:`.tap`) and malloc tuning for
from_generator (:mod:`.malloc`). The daemon's materialize worker encodes with it,
exactly as write-through does.
"""
