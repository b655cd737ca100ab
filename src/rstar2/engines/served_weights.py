"""The weights ``rstar2 serve`` holds: loads of the trainer's folders (only from under
``--weights-from``, checked before anything is written), folders mirrored from its ``--fetch-from``
weight service, and the fingerprint of what the model holds, which the trainer checks."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import HTTPException

from ..adapters import adapter_weights, base_weights, is_adapter
from ..auth import FolderRefused, allowed_folder, opened_folder
from .base import weights_fingerprint
from .hf import HFEngine

# For tests alone: from this load on (1: the first), a load is answered as done, with the version
# and the fingerprint of the tensors sent, while the model keeps its weights: the server that says
# and does not do, which the trainer's content check must catch (tests/rl/test_content_check.py).
PRETEND_LOADS_FROM = "RSTAR2_TEST_PRETEND_LOADS_FROM"


class ServedWeights:
    """The served engine's weights: loads so far, the last one's folder, the tensors it named (None:
    every one held) and their fingerprint (None: not computed yet)."""

    def __init__(
        self,
        engine: HFEngine,
        weights_from: list[Path] | None = None,
        api_key: str | None = None,
        fetch_from: str | None = None,
    ) -> None:
        self.engine = engine
        self.weights_from = list(weights_from or [])
        self.api_key = api_key  # also what it shows the trainer's weight service (a launch's one key)
        self.fetch_from = fetch_from  # the one weight service /mirror_weights fetches from
        self.dtype = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
        self.loads = 0
        self.path: str | None = None
        self.keys: list[str] | None = None
        self.adapter = False
        self.fingerprint: float | None = None

    def held(self) -> dict[str, Any]:
        """What the served model holds: policy version, loads, folder, and a fingerprint of the
        tensors the last load named, read back from the model (computed when first asked)."""
        if self.fingerprint is None:
            with self.engine.paused():
                # the adapter's tensors by its folder's names, else the base's by its own (adapted or not)
                model = self.engine.model
                held = adapter_weights(model) if self.adapter else base_weights(model, model.state_dict())
                self.fingerprint = weights_fingerprint({k: held[k] for k in self.keys or list(held)})
        return {
            "weights_version": self.engine.version,
            "weights_loads": self.loads,
            "weights_path": self.path,
            "weights_fingerprint": self.fingerprint,
            "dtype": self.dtype,
        }

    def _loaded(
        self, folder: str, keys: list[str] | None, adapter: bool, fingerprint: float | None = None
    ) -> None:
        self.loads += 1
        self.path, self.keys, self.adapter, self.fingerprint = folder, keys, adapter, fingerprint

    async def load(self, folder: str, version: str | None) -> int:
        """The safetensors of ``folder`` written into the model as policy ``version``; how many
        tensors. A folder outside ``--weights-from`` is refused before anything is read (403); one
        whose tensors do not fit, from their headers, before their data is (400); a load that fails
        half way (500) leaves the engine refusing requests until one succeeds. The files read are
        those checked: each opened once and checked open (``auth.opened_folder``)."""
        try:
            folder = str(allowed_folder(folder, self.weights_from))
        except FolderRefused as exc:
            raise HTTPException(403, str(exc)) from exc
        if not (version or "").isdigit():
            raise HTTPException(
                400,
                f"weight_version {version!r}: give the policy version of these weights "
                '(a count of updates, e.g. "0"): every token sampled says which version sampled it',
            )
        if self.loads + 1 >= int(os.environ.get(PRETEND_LOADS_FROM) or 1 << 62):
            return await asyncio.to_thread(self.pretend_load, folder, int(version))
        try:
            with opened_folder(Path(folder), self.weights_from) as private:
                return await self.load_opened(folder, private, int(version))
        except FolderRefused as exc:
            raise HTTPException(403, str(exc)) from exc

    async def load_opened(self, folder: str, private: Path, version: int) -> int:
        """``load`` from ``private``, the folder of ``folder``'s files opened and checked."""
        from safetensors.torch import load_file

        if is_adapter(private):  # an adapter over the base weights held (model.lora)
            loaded = await self._write(
                folder, "; nothing was loaded", self.engine.update_adapter, private, version
            )
            self._loaded(folder, None, adapter=True)
            return loaded
        files = sorted(private.glob("*.safetensors"))
        if not files:
            raise HTTPException(400, f"no *.safetensors files in {folder}")
        misfits = await asyncio.to_thread(self.misfits, files)
        if misfits:
            raise HTTPException(
                400, f"{folder}: tensors that do not fit the served model: {misfits[:5]}; nothing was loaded"
            )
        state: dict[str, Any] = {}
        for f in files:
            state.update(await asyncio.to_thread(load_file, str(f)))
        await self._write(folder, "", self.engine.update_weights, state, version)
        self._loaded(folder, list(state), adapter=False)
        return len(state)

    async def _write(self, folder: str, refused: str, write: Callable[..., Any], *args: Any) -> Any:
        """``write(*args)`` off the event loop: a ``ValueError`` (nothing was written) is a 400 (its
        message and ``refused``), any other failure a 500 (written in part: what the model holds is no
        longer what was fingerprinted)."""
        try:
            return await asyncio.to_thread(write, *args)
        except ValueError as exc:
            raise HTTPException(400, f"{folder}: {exc}{refused}") from exc
        except Exception as exc:
            self.fingerprint = self.keys = None
            raise HTTPException(500, f"{folder}: {exc}") from exc

    def pretend_load(self, folder: str, version: int) -> int:
        """For tests alone (``PRETEND_LOADS_FROM``): the answer of a load, with the version and the
        fingerprint of the tensors sent, while the model keeps its weights."""
        from safetensors.torch import load_file

        sent = {
            k: v for f in sorted(Path(folder).glob("*.safetensors")) for k, v in load_file(str(f)).items()
        }
        self.engine.invalidate(version)
        self._loaded(folder, list(sent), is_adapter(folder), weights_fingerprint(sent, self.dtype))
        return len(sent)

    def misfits(self, files: list[Path]) -> list[str]:
        """The tensors of ``files`` the model has not, or has in another shape (from their headers)."""
        from safetensors import safe_open

        model = self.engine.model
        held = {plain: tuple(t.shape) for plain, t in base_weights(model, model.state_dict()).items()}
        out = []
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    shape = tuple(fh.get_slice(key).get_shape())
                    if held.get(key) != shape:
                        served = list(held[key]) if key in held else "none"
                        out.append(f"{key} {list(shape)} (served: {served})")
        return out

    async def mirror(self, source: str, folder: str) -> dict[str, Any]:
        """A folder of the trainer's weight service copied here, checked, before it is loaded
        (``weight_transfer``: engines without the trainer's filesystem)."""
        from ..weight_transfer import MirrorError, mirror

        try:
            return await mirror(source, folder, self.weights_from, self.api_key, pinned=self.fetch_from)
        except FolderRefused as exc:
            raise HTTPException(403, str(exc)) from None
        except MirrorError as exc:
            raise HTTPException(502, str(exc)) from None
