"""The `tpu` device as PyTorch sees it: registration, `torch.tpu`, hooks, guard, autocast and the
unsupported-layout errors. The patches of torch's Python surface the device needs (storages,
torch.accelerator, generators, pinned memory, printing) live in hf_tpu.integrations: the runtime patches
nothing."""
