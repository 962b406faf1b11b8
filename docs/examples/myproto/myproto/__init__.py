"""An example protocol package that lives outside Squall (docs/writing-a-protocol.md)."""
