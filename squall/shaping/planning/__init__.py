"""Pure planning, no I/O: a profile's link state at a moment, and the kernel operations and changes it becomes."""
