"""coda: a ctypes binding of libcoda (GEMMs whose epilogues are small programs).

The library is found at $CODA_LIB, else inside the installed package
(`pip install .`), else at <repo>/build/libcoda.so. Tensors
are torch tensors (CPU, or CUDA when the library was built with CUDA); they
are described to coda by pointer, dtype, device and byte strides, never
copied. Every failing call raises coda.Error carrying the status name and
coda_last_error(). Arguments the C call could not take as given (a wrong
type, an integer outside its C type, a NUL inside a string, an unknown
device, weights not from pack_weights) raise TypeError or ValueError before
any C call: see "What raises what" in python/README.md, and include/coda.h
(the contract).

    import torch, coda
    ctx = coda.Context()
    a = torch.randn(7, 64).bfloat16(); b = torch.randn(24, 64).bfloat16()
    c = torch.empty(7, 24)
    coda.gemm(ctx, "nt", a, b, c)                       # c = a @ b.T

The binding is in parts, one per section of include/coda.h, and every name
is here in the package: _lib (loading, errors, argument checks, the C
structures, tensors), _core (context, GEMM, programs, fused GEMM, finishing
steps), _layer (the LLaMA layer and the block split at attention), _lm_loss
(the LM head and its loss) and _attention. The torch.library operators are
coda.ops and coda.attention_ops, the modules coda.nn.
"""

from ._lib import *  # noqa: F401,F403 (each part's public names)
from ._lib import _check, _dense_1d, _float, _int  # noqa: F401 (for coda.ops, coda.nn and the tests)
from ._core import *  # noqa: F401,F403
from ._layer import *  # noqa: F401,F403
from ._layer import _check_packed, _config_copy, _weight_shapes  # noqa: F401
from ._lm_loss import *  # noqa: F401,F403
from ._lm_loss import _lm_targets  # noqa: F401
from ._attention import *  # noqa: F401,F403


def _own_classes():
    """The parts' classes say they are coda's (coda.Error in a traceback,
    coda.PackedWeights in a pickle), not a private module's."""
    for v in list(globals().values()):
        if isinstance(v, type) and v.__module__.startswith(__name__ + "._"):
            v.__module__ = __name__


_own_classes()

__all__ = [
    "Error", "Context", "Program", "LlamaConfig", "Llama", "describe_tensor", "gemm",
    "gemm_epilogue", "choose_tiling", "finish_reduce", "finish_rstd", "finish_lse",
    "builtin_program", "builtin_program_names", "PackedWeights", "pack_weights", "unpack_grads",
    "Block", "LMLossOptions", "lm_loss_options", "lm_loss_workspace_size", "lm_loss", "AttentionShape",
    "attention_workspace_size", "attention_forward", "attention_backward", "scale_", "lib",
]
