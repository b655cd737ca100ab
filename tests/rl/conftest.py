"""The tiny model fixtures of tests/rollout (built locally, loaded through from_pretrained)."""

from ..rollout.conftest import CORPUS, tiny, tiny_dir  # noqa: F401
