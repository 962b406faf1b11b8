"""Papers' claims as data (``claims.yaml``) and the kinds that measure them."""
