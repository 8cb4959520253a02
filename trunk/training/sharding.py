"""Tensor parallelism and FSDP2 for a ``TrunkModule`` under Lightning's ``ModelParallelStrategy``
(``configs/trainer/fsdp2_cpu.yaml``, ``configs/trainer/tensor_parallel_cpu.yaml``,
``configs/trainer/tp_fsdp2_gpu.yaml``)."""

from __future__ import annotations

import torch
from torch import nn

from trunk.models import Block
from trunk.models.trunk import Attention, FeedForward


def shard(model: nn.Module, mesh, bf16: bool = False) -> None:
    """Tensor parallelism over the mesh's ``tensor_parallel`` dimension (``tensor_parallel``), then FSDP2 over its
    ``data_parallel`` one: each block (trunk and translation decoders) is one ``fully_shard`` unit, then the root takes
    the rest (stems, heads, norms; tied weights stay one parameter). Parameters, gradients and AdamW state are split
    across the processes; a block's weights are gathered just for its forward and backward. With ``bf16``
    (bf16-mixed runs) the gathers move bf16 (``MixedPrecisionPolicy``) and gradients are reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    names = mesh.mesh_dim_names or ()
    split = "tensor_parallel" in names and mesh["tensor_parallel"].size() > 1
    if split:
        tensor_parallel(model, mesh["tensor_parallel"])
    data_parallel = mesh["data_parallel"] if "data_parallel" in names else mesh
    if split and data_parallel.size() == 1:
        return  # tensor parallelism alone: nothing to shard across data-parallel processes
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    )
    for block in [m for m in model.modules() if isinstance(m, Block)]:
        fully_shard(block, mesh=data_parallel, mp_policy=policy)
    fully_shard(model, mesh=data_parallel, mp_policy=policy)


def tensor_parallel(model: nn.Module, mesh) -> None:
    """Megatron's split of every block over the processes of ``mesh``: the attention's query and key/value projections
    and the feed-forward's first layer by output columns (each process computes its share of the heads and of the
    hidden units), the attention's output projection and the feed-forward's second layer by input rows (their partial
    sums added across processes: one all-reduce each in forward, one each in backward). Everything outside the blocks
    (stems, norms, heads) is replicated: each process computes it in full on the same batch."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    size = mesh.size()
    trunk_cfg = model.trunk.cfg
    if trunk_cfg.n_heads % size or trunk_cfg.d_ff % size:
        raise ValueError(
            f"Tensor parallelism over {size} processes splits the heads and the feed-forward width: "
            f"n_heads={trunk_cfg.n_heads} and d_ff={trunk_cfg.d_ff} must be multiples of {size} (the strategy's "
            "tensor_parallel_size)."
        )
    if trunk_cfg.positions == "disentangled":
        raise ValueError(
            "Tensor parallelism does not split DeBERTa's disentangled attention (positions: disentangled) yet: its "
            "relative table feeds every head's projections. Train it with DDP or FSDP2 (tensor_parallel_size: 1)."
        )
    if getattr(model, "router", None) is not None and model.router.deltas:
        raise ValueError(
            "Tensor parallelism does not split model.peft's deltas: train them with DDP or FSDP2 "
            "(tensor_parallel_size: 1)."
        )
    KeyValueColwise, OwnHeads = _key_value_colwise(), _own_heads()
    plan = {}
    for name, module in model.named_modules():
        if hasattr(module, "keep_heads"):
            plan[name] = OwnHeads()
        elif isinstance(module, Attention):
            plan.update({f"{name}.q_proj": ColwiseParallel(), f"{name}.kv_proj": KeyValueColwise(),
                         f"{name}.out_proj": RowwiseParallel()})
        elif isinstance(module, FeedForward):
            plan.update({f"{name}.fc_in": ColwiseParallel(), f"{name}.fc_out": RowwiseParallel(),
                         **({f"{name}.fc_gate": ColwiseParallel()} if module.fc_gate is not None else {})})
    parallelize_module(model, mesh, plan)


def _key_value_colwise() -> type:
    """A tensor-parallel style for the fused key/value projection, whose output is [keys of every head; values of
    every head]: each process computes its heads' rows of both halves, the layout ``Attention`` reads, from weights it
    holds whole (replicated; FSDP2 still shards them over data-parallel groups). Neither ``ColwiseParallel`` (whose
    contiguous split would give one process every key and the other every value) nor a strided split fits: torch
    cannot load a full optimizer state into a strided shard on a 2-D mesh. So the fused projection, a sixth of a block's
    weights, is not divided by tensor parallelism; its work is. The parameters keep their one-process layout."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor
    from torch.distributed.tensor.parallel.style import ParallelStyle

    class KeyValueColwise(ParallelStyle):
        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            width = module.out_features // 2
            share = _own_share(width, device_mesh)
            mine = torch.arange(share.start, share.stop)
            rows = torch.cat([mine, width + mine])  # this process's heads' keys, then their values
            for name, param in list(module.named_parameters()):
                module.register_parameter(name, nn.Parameter(distribute_tensor(param, device_mesh, [Replicate()])))

            def forward(x: torch.Tensor) -> torch.Tensor:
                # Each process's gradients (of the input, and of its rows of the weights) are its share: summed in
                # backward.
                x = DTensor.from_local(x, device_mesh, [Replicate()], run_check=False).to_local(
                    grad_placements=[Partial()]
                )
                at = rows.to(x.device)
                weight = module.weight.to_local(grad_placements=[Partial()])[at]
                bias = None if module.bias is None else module.bias.to_local(grad_placements=[Partial()])[at]
                return torch.nn.functional.linear(x, weight, bias)

            module.forward = forward
            return module

    return KeyValueColwise


def _own_heads() -> type:
    """A tensor-parallel style for a module that says itself how it splits by heads (``keep_heads``: a position
    scheme's attention bias, trunk/models/positions/): each process keeps its share of the heads."""
    from torch.distributed.tensor.parallel.style import ParallelStyle

    class OwnHeads(ParallelStyle):
        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            module.keep_heads(_own_share(module.n_heads, device_mesh), device_mesh)
            return module

    return OwnHeads


def _own_share(n: int, mesh) -> slice:
    """This process's contiguous share of ``n`` heads (or of their rows): the split every tensor-parallel style uses."""
    size, rank = mesh.size(), mesh.get_local_rank()
    return slice(rank * n // size, (rank + 1) * n // size)
