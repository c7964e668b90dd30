"""What one worker reads each epoch: orders (:mod:`.order`), shares (:mod:`.shares`),
options and resume (:mod:`.plan`), mixes of caches (:mod:`.mix`). No I/O."""
