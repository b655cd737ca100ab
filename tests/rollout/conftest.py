"""A scripted stand-in engine for the tests of the code around engines (the tiny models and
tokenizers are the shared fixtures of ``tests/conftest.py``)."""

from __future__ import annotations

from rstar2.chat.format import ChatFormat


class ScriptedEngine:
    """A stand-in engine for tests of the code around engines: it answers each trajectory's turns
    with scripted texts (chosen by the problem found in the prompt), tokenized plus the end token."""

    def __init__(
        self,
        fmt: ChatFormat,
        scripts: dict[str, list[str]],
        end_id: int,
        turn_marker: str,
        char_level: bool = False,
    ):
        """``char_level``: emit each character as its own token(s), a tokenization of the text that
        re-encoding never gives back, with a different logprob at every position."""
        self.fmt, self.scripts, self.end_id, self.turn_marker = fmt, scripts, end_id, turn_marker
        self.char_level = char_level
        self.name = "scripted"
        self.version_source = None  # it says no version (tests that need one set it)
        self.capacity_tokens = 1 << 20
        self.in_flight = 0
        self.generated: dict[str, list[list[int]]] = {}

    async def generate(self, prompt_ids, params):
        from rstar2.engines.base import Generation

        text = self.fmt.decode(prompt_ids)
        problem = next(p for p in self.scripts if p in text)
        turn = text.count(self.turn_marker) - 1
        script = self.scripts[problem][turn]
        ids = (
            [i for ch in script for i in self.fmt.encode(ch)] if self.char_level else self.fmt.encode(script)
        )
        ids = ids + [self.end_id]
        # a continued turn (the scheduler granted fewer tokens than the turn needed): go on from there
        done = next((k for k in range(len(ids) - 1, 0, -1) if prompt_ids[-k:] == ids[:k]), 0)
        ids = ids[done:]
        finish = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        self.generated.setdefault(problem, []).append(ids)
        if not self.char_level:
            return Generation(ids, [-0.5] * len(ids), finish)
        logprobs = [-0.001 * (len(prompt_ids) + i + 1) for i in range(len(ids))]  # distinct everywhere
        self.logprobs = getattr(self, "logprobs", {})
        self.logprobs.setdefault(problem, []).append(logprobs)
        return Generation(ids, logprobs, finish)

    async def close(self):
        pass
