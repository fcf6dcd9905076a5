"""The chunked head and rank-local inference on a sharded student (FSDP2, DeepSpeed ZeRO-3).

Outside a module's forward FSDP2 holds a shard of each weight (a DTensor) and ZeRO-3 holds none
of it (a 0-element tensor), so the head's passes (heads.py) cannot read the weight as it is:

* `head_call` hands a head pass the whole weight, gathered once for the pass (every chunk reads
  that one copy, never one all-gather per chunk), with its gradient reduced like any layer's.
  FSDP2: accelerate puts the final norm and the head (with the embedding, when tied) in one group
  that stays unsharded from the model's forward until its backward, so the head's parameter is
  whole when the loss runs; a group sharded by then is gathered (`unshard`), and FSDP2's
  post-backward reduce-scatters what the pass accumulated into it. (Calling the head module a
  second time instead crashed torch 2.13's grouped hooks on CPU.) ZeRO-3: the pass runs as the
  head module's own forward, so DeepSpeed's hooks gather the weight for it, gather it again for
  its backward and reduce its gradient. Tied embeddings need nothing more: the head's weight is
  the embedding's parameter, gathered and reduced as one.
* `full_weights` gathers every weight for a stretch of rank-local inference (rollouts, scoring
  with the live student, rank 0's evaluation): a sharded forward is a collective, so every rank
  would otherwise have to run the same number of forwards, in step. TRL gathers ZeRO-3 weights
  for generation the same way (`ds3_gather_for_generation`).

With one process or DDP both are plain calls: the parameters are whole on every rank.

A teacher sharded for inference (`teacher.shard=true`, `shard_for_inference`) is split the same
way over the ranks of an FSDP2 or ZeRO-3 launch, with no gradients and no optimizer state, and is
never gathered whole: each of its forwards gathers one layer at a time, so it is a collective
every rank runs in step (`inference_forward`, `agreed_count`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, TypeVar
from weakref import WeakKeyDictionary, WeakSet

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from distill.kernels.heads import head_module, output_head

T = TypeVar("T")
M = TypeVar("M", bound=torch.nn.Module)


def _fsdp_modules(model: torch.nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _zero3(model: torch.nn.Module) -> bool:
    # DeepSpeed tags every parameter it partitions with an id.
    return any(hasattr(p, "ds_id") for p in model.parameters())


def sharding_of(model: torch.nn.Module) -> str | None:
    """`fsdp` (FSDP2), `zero3`, or None (whole parameters: one process, DDP, a replicated teacher)."""
    if _fsdp_modules(model):
        return "fsdp"
    return "zero3" if _zero3(model) else None


def head_call(
    model: torch.nn.Module, fn: Callable[[Tensor, Tensor, Tensor | None], T], hidden_N_H: Tensor
) -> T:
    """`fn(hidden_N_H, weight_V_H, bias_V)` with the model's output head whole (module docstring)."""
    head = head_module(model)
    kind = sharding_of(model)
    if kind == "zero3":
        return _zero3_head_call(model, head, fn, hidden_N_H)
    if kind == "fsdp":
        weight, _ = output_head(model)
        if isinstance(weight, DTensor):
            # The head's group is sharded: gather it (its post-backward reduces the gradient and
            # reshards). accelerate's group of the head stays unsharded after the model's forward,
            # so this is the no-op case in training.
            owner: Any = next(m for m in (head, model) if m in _fsdp_modules(model))
            owner.unshard()
    weight, bias = output_head(model)  # refuses heads the chunked passes cannot reproduce
    if isinstance(weight, DTensor):
        raise RuntimeError(
            "the output head holds a shard outside its forward (a DTensor); shard it with fully_shard"
        )
    return fn(hidden_N_H, weight, bias)


def _zero3_head_call(
    model: torch.nn.Module,
    head: torch.nn.Module,
    fn: Callable[[Tensor, Tensor, Tensor | None], T],
    hidden_N_H: Tensor,
) -> T:
    """ZeRO-3 keeps no rows of the weight outside a forward: `fn` runs as the head module's forward."""
    output_head(model)  # refuses heads the chunked passes cannot reproduce

    def forward(hidden: Tensor) -> T:
        weight, bias = output_head(model)
        return fn(hidden, weight, bias)

    head.forward = forward  # an instance attribute: nn.Module.__call__ runs it between the hooks
    try:
        out: T = head(hidden_N_H)
    finally:
        del head.forward
    return out


@contextmanager
def full_weights(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Every weight of a sharded `model` whole on this rank for the block, the forwards inside it
    rank-local (no collective); entering and leaving are collectives, so every rank enters. A
    model with whole parameters is yielded as it is. Training resumes sharded after the block."""
    kind = sharding_of(model)
    if kind == "fsdp":
        with _fsdp_whole(model):
            yield model
    elif kind == "zero3":
        with _zero3_whole(model):
            yield model
    else:
        yield model


@contextmanager
def _fsdp_whole(model: torch.nn.Module) -> Iterator[None]:
    modules = _fsdp_modules(model)
    states = [m._get_fsdp_state() for m in modules]
    # Keep them unsharded through the block (torch's own recipe for evals): a forward would
    # otherwise reshard after itself and all-gather again at the next one. The settings are put
    # back as they were after it (accelerate keeps the head's group unsharded after a forward).
    saved = [
        (s._auto_reshard_after_forward, [g.post_forward_mesh_info for g in s._fsdp_param_groups])
        for s in states
    ]
    for module in modules:
        module.unshard()
        module.set_reshard_after_forward(False, recurse=False)
    # transformers' generate syncs every token over the processes (`synced_gpus`) for a model
    # torch's FSDP manages: these forwards are local, and rank 0's evaluation generates alone.
    managed = [m for m in model.modules() if getattr(m, "_is_fsdp_managed_module", False)]
    for module in managed:
        setattr(module, "_is_fsdp_managed_module", False)  # noqa: B010
    try:
        yield
    finally:
        for module in managed:
            setattr(module, "_is_fsdp_managed_module", True)  # noqa: B010
        for state, (auto, infos) in zip(states, saved, strict=True):
            state._auto_reshard_after_forward = auto
            for group, info in zip(state._fsdp_param_groups, infos, strict=True):
                group.post_forward_mesh_info = info
        for module in modules:
            module.reshard()


@contextmanager
def _zero3_whole(model: torch.nn.Module) -> Iterator[None]:
    import deepspeed
    from trl.models.utils import add_hooks, remove_hooks

    optimizer = _ZERO3_OPTIMIZERS.get(model)
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        if optimizer is None:  # before training: no hooks to lift
            yield
            return
        # Lift the partition hooks (they would release each module's weights after its forward)
        # as TRL does for generation, and the start-of-forward hook, whose trace check is a
        # collective. TRL's helpers read `<engine>.optimizer.parameter_offload`.
        engine, offload = SimpleNamespace(optimizer=optimizer), optimizer.parameter_offload
        start = offload.module._forward_pre_hooks[offload.fwd_pre_hook.id]
        offload.fwd_pre_hook.remove()
        remove_hooks(engine)
        try:
            yield
        finally:
            add_hooks(engine)
            offload.fwd_pre_hook = offload.module.register_forward_pre_hook(start, prepend=True)


def local_shard(param: Tensor) -> Tensor:
    """This rank's part of a parameter: FSDP2's local rows of its DTensor, ZeRO-3's flat
    partition (`ds_tensor`), the parameter itself when it is whole."""
    if isinstance(param, DTensor):
        return param.to_local()
    partition = getattr(param, "ds_tensor", None)
    return param if partition is None else partition


def shard_of(whole: Tensor, param: Tensor) -> Tensor:
    """The part of `whole` (a tensor of `param`'s full shape) this rank holds of `param`."""
    import torch.distributed as dist

    if isinstance(param, DTensor):  # FSDP2: dim 0 in torch.chunk's pieces, one per rank
        part = whole.chunk(dist.get_world_size(), dim=0)[dist.get_rank()]
        if part.shape != param.to_local().shape:
            raise RuntimeError(
                f"unexpected FSDP2 shard {tuple(param.to_local().shape)} of {tuple(whole.shape)}"
            )
        return part
    partition = getattr(param, "ds_tensor", None)
    if partition is None:
        return whole
    size = partition.numel()  # ZeRO-3: the flat tensor, padded, in equal consecutive partitions
    start = dist.get_rank() * size
    part = torch.zeros(size, dtype=whole.dtype, device=whole.device)
    flat = whole.reshape(-1)[start : start + size]
    part[: flat.numel()] = flat
    return part


def gather_shards(part: Tensor, param: Tensor) -> Tensor:
    """The whole tensor of `param`'s full shape from every rank's `part` (a collective)."""
    import torch.distributed as dist

    if isinstance(param, DTensor):
        return DTensor.from_local(part, param.device_mesh, param.placements, run_check=False).full_tensor()
    if getattr(param, "ds_tensor", None) is None:
        return part
    out = torch.empty(part.numel() * dist.get_world_size(), dtype=part.dtype, device=part.device)
    dist.all_gather_into_tensor(out, part.contiguous())
    shape: Any = getattr(param, "ds_shape")  # noqa: B009  (DeepSpeed's attribute, not torch's)
    return out[: int(getattr(param, "ds_numel"))].view(shape)  # noqa: B009


@contextmanager
def whole_loading() -> Iterator[None]:
    """Models loaded in the block load whole on this rank alone. Under ZeRO-3 transformers
    partitions every model it loads while a DeepSpeed config is active (`zero.Init`, a collective
    each rank must join): rank 0 alone loading the final checkpoint for its evaluation would wait
    forever."""
    import transformers.integrations.deepspeed as hf_deepspeed

    ref = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = ref


# model -> the ZeRO-3 optimizer partitioning it, whose hooks `full_weights` lifts for its block.
_ZERO3_OPTIMIZERS: WeakKeyDictionary[torch.nn.Module, Any] = WeakKeyDictionary()


def track_optimizer(model: torch.nn.Module, optimizer: Any) -> None:
    """Remember the trainer's (accelerate-wrapped) optimizer of a ZeRO-3 `model` (a no-op otherwise)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if sharding_of(model) == "zero3" and hasattr(inner, "parameter_offload"):
        _ZERO3_OPTIMIZERS[model] = inner


# Teachers split over the ranks for inference (`shard_for_inference`); a ZeRO-3 one keeps its
# DeepSpeed engine here, the owner of the hooks that gather its weights.
_INFERENCE_SHARDED: WeakSet[torch.nn.Module] = WeakSet()
_INFERENCE_ENGINES: WeakKeyDictionary[torch.nn.Module, Any] = WeakKeyDictionary()


def shard_for_inference(model: M, kind: str) -> M:
    """`model` split over the ranks for inference only (`kind`: `fsdp` or `zero3`, the launch's
    own): frozen, in eval mode, no optimizer. FSDP2: each decoder layer (`_no_split_modules`) a
    group, the embeddings, final norm and head the root's (tied ones stay one parameter), every
    group resharded after its forward. ZeRO-3: DeepSpeed's partitioning without an optimizer, as
    TRL prepares its reference model (`trl.models.utils.prepare_deepspeed`)."""
    model.requires_grad_(False)
    model.eval()
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        layers = set(getattr(model, "_no_split_modules", None) or ())
        if not layers:
            raise ValueError(f"teacher.shard=true: {type(model).__name__} names no decoder layer to shard")
        for module in list(model.modules()):
            if type(module).__name__ in layers:
                fully_shard(module, reshard_after_forward=True)
        # True, not the root's default: the root would otherwise keep the embeddings and head
        # whole after its forward, waiting for a backward that never comes.
        fully_shard(model, reshard_after_forward=True)
    elif kind == "zero3":
        import deepspeed

        engine, *_ = deepspeed.initialize(model=model, config=_zero3_inference_config(model))
        _INFERENCE_ENGINES[model] = engine
    else:
        raise ValueError(f"teacher.shard=true needs an FSDP2 or ZeRO-3 launch, not {kind}")
    _INFERENCE_SHARDED.add(model)
    return model


def _zero3_inference_config(model: torch.nn.Module) -> dict[str, Any]:
    """The launch's DeepSpeed config (accelerate's, from `accelerate launch`'s environment) for a
    model that only runs forwards: no optimizer, scheduler or optimizer offload (as TRL drops
    them), one sample a micro-batch for DeepSpeed's batch arithmetic, the precision the model was
    loaded in, and TRL's bucket sizes from the hidden size in place of accelerate's `auto`."""
    import copy

    from accelerate.utils import DeepSpeedPlugin

    from distill.launch import world_size

    config: dict[str, Any] = copy.deepcopy(DeepSpeedPlugin().deepspeed_config)
    for key in ("optimizer", "scheduler", "gradient_clipping"):
        config.pop(key, None)
    zero = {k: v for k, v in config.get("zero_optimization", {}).items() if v != "auto"}
    zero.pop("offload_optimizer", None)
    hidden = int(getattr(model.config, "hidden_size"))  # noqa: B009  (transformers' config attribute)
    zero.update(
        stage=3,
        reduce_bucket_size=hidden * hidden,
        stage3_param_persistence_threshold=10 * hidden,
        stage3_prefetch_bucket_size=int(0.9 * hidden * hidden),
    )
    dtype = next(model.parameters()).dtype
    config.update(
        zero_optimization=zero,
        train_micro_batch_size_per_gpu=1,
        gradient_accumulation_steps=1,
        train_batch_size=world_size(),
        bf16={"enabled": dtype == torch.bfloat16},
        fp16={"enabled": dtype == torch.float16},
    )
    return config


def inference_sharded(model: torch.nn.Module) -> bool:
    """`model` was split for inference (`shard_for_inference`): its forwards are collectives."""
    return model in _INFERENCE_SHARDED


def inference_forward(model: torch.nn.Module, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` (decoder and head passes of one batch) as one forward of a model sharded for
    inference, so the root's hooks run around it: FSDP2 gathers the embeddings, final norm and
    head for it (the layers gather themselves) and lazily sets its groups up on the first;
    ZeRO-3 starts and ends its forward trace. A whole model runs `fn` as it is."""
    if not inference_sharded(model):
        return fn(*args)
    model.forward = fn  # an instance attribute: nn.Module.__call__ runs it between the hooks
    try:
        out: T = model(*args)
    finally:
        del model.forward
    return out


def agreed_count(model: torch.nn.Module, count: int) -> int:
    """The most forwards any rank will run on `model` for this call (`count` for a whole model):
    a rank with fewer runs the rest on a throwaway batch, so every rank joins each collective."""
    if not inference_sharded(model):
        return count
    import torch.distributed as dist

    # On the model's device: NCCL reduces only CUDA tensors, gloo CPU ones.
    most = torch.tensor([count], dtype=torch.long, device=next(model.parameters()).device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return int(most.item())


def whole_copy(param: Tensor) -> Tensor:
    """A detached whole copy of a parameter of a model sharded for inference (a collective)."""
    if isinstance(param, DTensor):
        return param.full_tensor().detach().clone()
    if getattr(param, "ds_tensor", None) is not None:
        import deepspeed

        with deepspeed.zero.GatheredParameters([param]):
            return param.detach().clone()
    return param.detach()
