"""What the `tpu` backend reads from TorchDynamo while it compiles.

What Dynamo must know about the tpu device before it traces anything (skip the runtime, fold `torch.tpu`
queries, the `_grouped_mm` fake-tensor fix) is applied by hf_tpu.integrations.torch_dynamo as Dynamo's
modules load: the runtime patches nothing.
"""

from __future__ import annotations


def fullgraph_requested() -> bool:
    """Whether the `torch.compile` call being traced now asked for one graph (`fullgraph=True`). Read from
    Dynamo's active frame translator while a backend compiles the forward; False when none is active
    (a backward graph compiles later, at `.backward()`)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        return bool(InstructionTranslator.current_tx().one_graph)
    except Exception:  # noqa: BLE001 - no translator active, or Dynamo's internals moved
        return False
