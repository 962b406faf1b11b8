"""A pytest plugin for test modules that run pytest in process (``pytester.runpytest``).

Pytester's in-process runs put ``sys.modules`` back as they found it, so whatever Squall's plugin
imports during such a run (the catalog imports every protocol folder, and with them torch) would be
imported again by the next run; a C extension imported twice corrupts memory, and the process
later crashes in the garbage collector. Importing it all once here, before any in-process run,
makes it part of what pytester restores. Use it as ``pytest_plugins = ["pytester",
"tests.pytester_preload"]``.
"""

from __future__ import annotations

import squall.experiment.matrix  # noqa: F401 - the plugin's matrix parsing
from squall.protocols.catalog import discover

discover()
