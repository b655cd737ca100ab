"""The training recipe and the tiny embedded default."""
