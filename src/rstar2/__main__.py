"""``python -m rstar2 …`` (what ``torchrun -m rstar2 train …`` runs on every process)."""

from .cli import main

main()
