"""The object-store tier under the daemons' local caches (docs/operations.md, "Object store")."""
