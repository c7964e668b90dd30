"""The format layer: every byte a cache keeps on disk.

Layouts (:mod:`.layout`), record bodies (:mod:`.codec`, :mod:`.fixed_decode`),
stored values and their checksums (:mod:`.values`), blocks of small elements
(:mod:`.blocks`), the shard store (:mod:`.store`, the only module importing
lmdb; :mod:`.read_ahead`) and reads by global index (:mod:`.lookup`). Both the
client and the daemon build on it; it imports neither, nor TensorFlow.
"""
