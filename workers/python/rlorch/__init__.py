"""rlorch: join an rlorch run from your own trainer or inference engine.

A Python layer over librlorch (the embedding SDK's C library, through the
standard library's ctypes: nothing to compile, nothing to install). Importing it does not import PyTorch:
`rlorch.torch` (the manifest, receiver and batch helpers for PyTorch) loads
on first use, so a trainer without torch works with numpy buffers.

    import rlorch
    with rlorch.Worker(role="inference", orchestrator="10.0.0.1:7070",
                       tensors=rlorch.torch.manifest(model)) as w:
        for cmd in w:
            ...

docs/INTEGRATION.md describes the guarantees; include/rlorch/rlorch.h the
library underneath."""
from ._core import (
    API_VERSION,
    Batch,
    BatchRollout,
    BroadcastGate,
    Command,
    Completion,
    Part,
    RlorchError,
    Sampling,
    Stopped,
    Tensor,
    Worker,
    library_path,
    version,
)

__all__ = [
    "API_VERSION",
    "Batch",
    "BatchRollout",
    "BroadcastGate",
    "Command",
    "Completion",
    "Part",
    "RlorchError",
    "Sampling",
    "Stopped",
    "Tensor",
    "Worker",
    "library_path",
    "version",
]


def __getattr__(name):
    # `rlorch.torch` without `import rlorch.torch`: torch is imported here,
    # on first use, never at `import rlorch`.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'rlorch' has no attribute {name!r}")
