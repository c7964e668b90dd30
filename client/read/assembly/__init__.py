"""An epoch's share as numbered chunks (:mod:`.chunks`, :mod:`.mix_chunks`), decoded
(:mod:`.decode`) into reused aligned arrays (:mod:`.buffers`)."""
