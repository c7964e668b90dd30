"""What reads report to the daemon: elements, bytes and the input stall (:mod:`.report`)."""
