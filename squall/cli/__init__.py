"""The ``squall`` command: one module per subcommand, :mod:`squall.cli.main` dispatches."""
