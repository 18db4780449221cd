# The compiled `_cpu` extension (see _cpu.cpp): pointers are tensors' data_ptr(), strides are in elements.

def supported() -> tuple[bool, bool]: ...
def attention(
    q: int, k: int, v: int, out: int, ldq: int, ldk: int, ldv: int, ldo: int, starts: int, batch: int,
    heads: int, kv_heads: int, dim: int, left: int, right: int, scale: float, bf16: bool, threads: int, bias: int,
    bias_head: int, bias_row: int, /,
) -> None: ...
def add_layer_norm(
    h: int, h_bf16: bool, ldh: int, x: int, ldx: int, out: int, low: int, weight: int, bias: int, rows: int,
    cols: int, eps: float, threads: int, /,
) -> None: ...
