"""The ``rstar2`` command's groups, a module each; ``cli.py`` assembles them into the one app."""
