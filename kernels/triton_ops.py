"""The Triton implementations of the dispatch surface (imported lazily by `kernels.Ops`)."""
from .tl_attention import paged_attention  # noqa: F401
from .tl_norm import add_rms_norm, rms_norm  # noqa: F401
from .tl_qmatmul import dequantize, embedding, qmatmul  # noqa: F401
from .tl_rope import rope  # noqa: F401
from .tl_silu_mul import silu_mul  # noqa: F401
from .tl_write_kv import write_kv  # noqa: F401
from .qweight import QWeight


def prepare_weight(w: QWeight, unpack_quantized: bool = False, pack_quantized: bool = True) -> QWeight:
    """The Triton kernels read the GGUF block format as it is: nothing to prepare."""
    return w
