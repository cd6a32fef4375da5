"""The ``oxillama`` command: ``oxillama generate``, ``oxillama serve`` and
the other subcommands (``oxillama --help`` lists them)."""
