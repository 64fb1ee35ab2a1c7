"""torch's device-backend autoload entry point (group `torch.backends`): `import torch` registers `tpu`.

Kept outside the `hf_tpu` package so that nothing here can raise during `import torch`.
"""


def autoload() -> None:
    import os
    import warnings

    if os.environ.get("HF_TPU_AUTOLOAD", "1") == "0":
        return
    try:
        import hf_tpu  # noqa: F401 - registers the device
    except Exception as exc:  # noqa: BLE001 - autoload must never break `import torch`
        warnings.warn(f"hf_tpu: the tpu device was not registered at import torch: {exc}", stacklevel=2)
