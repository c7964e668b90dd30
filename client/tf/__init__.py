"""The TensorFlow adapter: the only client modules that import tensorflow.

Element specs and layouts, batches in and out of tf.data (:mod:`.convert`), the
datasets cc.cache() and cc.dataset() return (:mod:`.datasets`), pipelines as
graphs for fingerprints and shipping (:mod:`.graphs`), the write-through tap
(:mod:`.tap`) and malloc tuning for from_generator (:mod:`.malloc`). The daemon's
materialize worker encodes with it, exactly as write-through does.
"""
