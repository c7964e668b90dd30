"""The data plane: record bytes on a port of their own (docs/protocol.md)."""
