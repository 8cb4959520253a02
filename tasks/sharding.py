"""FSDP2 for a ``TrunkModule`` under Lightning's ``ModelParallelStrategy`` (``configs/trainer/fsdp2_cpu.yaml``)."""

from __future__ import annotations

import torch
from torch import nn
from trunk.models import Block


def shard(model: nn.Module, mesh, bf16: bool = False) -> None:
    """Each block (trunk and translation decoders) is one ``fully_shard`` unit, then the root takes the rest
    (stems, heads, norms; tied weights stay one parameter). Parameters, gradients and AdamW state are
    split across the processes; a block's weights are gathered just for its forward and backward. With
    ``bf16`` (bf16-mixed runs) the gathers move bf16 (``MixedPrecisionPolicy``) and gradients are reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if "tensor_parallel" in (mesh.mesh_dim_names or ()) and mesh["tensor_parallel"].size() > 1:
        raise ValueError(
            f"Trunk shards its model over data-parallel processes only (FSDP2), but the strategy gives "
            f"{mesh['tensor_parallel'].size()} processes to tensor parallelism. Set the strategy's data_parallel_size to the "
            "number of processes and tensor_parallel_size=1, as configs/trainer/fsdp2_cpu.yaml does."
        )
    data_parallel = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for block in [m for m in model.modules() if isinstance(m, Block)]:
        fully_shard(block, mesh=data_parallel, mp_policy=policy)
    fully_shard(model, mesh=data_parallel, mp_policy=policy)
