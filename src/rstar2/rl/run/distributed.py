"""Several training processes (``torchrun --nproc-per-node N -m rstar2 train …``): parameters sharded
with FSDP2 on CUDA (NCCL) or CPU (gloo); each process rolls out its share of the problems with a
full copy of the weights, so the update is the only collective-heavy part."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


LOCAL = World()  # one process, no torchrun


def init_world(device: str = "auto") -> World:
    """Join the process group that torchrun describes in the environment (no-op without it)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available() and device != "cpu"
    if size == 1:
        dev = torch.device(device if device not in ("auto", "cuda") else ("cuda" if cuda else "cpu"))
        if dev.type == "cuda" and dev.index is None:  # by number, as torchrun's: set_device needs one
            dev = torch.device("cuda", torch.cuda.current_device())
        return World(0, 1, dev)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return World(dist.get_rank(), dist.get_world_size(), torch.device(f"cuda:{local}" if cuda else "cpu"))


def shard(model: torch.nn.Module, world: World) -> torch.nn.Module:
    """FSDP2: each decoder layer is its own unit, then the root (embeddings, head)."""
    if not world.distributed:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(world.device.type, (world.size,))
    for layer in getattr(getattr(model, "model", model), "layers", []):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def on_device(world: World, fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` for a worker thread (``asyncio.to_thread``), on this process's GPU: CUDA's current
    device belongs to each thread, and a new one starts on device 0."""

    def run(*args: Any, **kwargs: Any) -> T:
        if world.device.type == "cuda":
            torch.cuda.set_device(world.device)
        return fn(*args, **kwargs)

    return run


def full_state_dict(model: torch.nn.Module, world: World) -> dict[str, torch.Tensor]:
    """Unsharded parameters on every process; a tied parameter once, under its first name (the
    sharded state dict would otherwise hold two copies and save both)."""
    if not world.distributed:
        state = {k: v.detach() for k, v in model.state_dict().items()}
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        )
    names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    return {k: v for k, v in state.items() if k in names}


def all_sum(values: Sequence[float], world: World) -> list[float]:
    if not world.distributed:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=world.device)
    dist.all_reduce(t)
    return t.tolist()


def all_max(value: float, world: World) -> Any:
    """The largest ``value`` over the processes, of its own type (int or float)."""
    if not world.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=world.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return type(value)(t.item())


def all_gather_objects(obj: Any, world: World) -> list[Any]:
    if not world.distributed:
        return [obj]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def close(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()
